"""Display helpers for the run list's rows (the page's script formats the same way)."""

from django import template

from runs.domain import text

register = template.Library()


@register.filter
def span(seconds) -> str:
    """A running time for people: "0.4 s", "12 s", "3 m 05 s", "2 h 04 m"."""
    if seconds is None:
        return ""
    seconds = float(seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} m {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} m"


@register.filter
def first_line(value) -> str:
    """The first line of an error, for a row (the whole text is in its title)."""
    return text.first_line(value)
