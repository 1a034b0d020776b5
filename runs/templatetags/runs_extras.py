"""Display helpers for run templates."""

from django import template

register = template.Library()


@register.filter
def short_id(value) -> str:
    return str(value)[:8]


@register.filter
def ms_since(later, earlier) -> str:
    """"+12 ms" between two times (requested -> delivered -> applied), or "" if unknown."""
    if not later or not earlier:
        return ""
    return f"+{(later - earlier).total_seconds() * 1000:.0f} ms"


@register.filter
def event_note(event) -> str:
    """The why of an event, if it has one: a request's reason, a stop's, or an error."""
    data = event.data or {}
    return data.get("reason") or data.get("stop_reason") or data.get("error") or ""


@register.filter
def step_message(event) -> str:
    """What a step's model calls said and which tools it ran, as its event recorded them:
    the committed answer a run's page shows once the streamed one is gone."""
    data = event.data or {}
    said = [reply.get("content") or "" for reply in data.get("replies") or ()]
    tools = [f"{call.get('name')} ({call.get('ms', 0):.0f} ms"
             f"{'' if call.get('ok') else ', failed'})" for call in data.get("tools") or ()]
    text = "\n".join(part for part in said if part)
    if tools:
        text += ("\n" if text else "") + "tools: " + ", ".join(tools)
    return text


@register.filter
def allows(run, action) -> bool:
    """Whether ``run``'s state allows ``action`` (``Run.allowed_actions``); with no run, as
    in the row template the page clones, nothing is allowed."""
    return run is not None and action in run.allowed_actions
