"""Display helpers for the run list's rows. Durations are not among them: the rows carry
``data-seconds`` and the page's one duration format (``span`` in static/runs/common.js)
writes them out, as it does for the running times it keeps ticking."""

from django import template

from runs.domain import text

register = template.Library()


@register.filter
def first_line(value) -> str:
    """The first line of an error, for a row (the whole text is in its title)."""
    return text.first_line(value)
