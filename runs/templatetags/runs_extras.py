"""Display helpers for run templates."""

import json

from django import template

from runs.domain import text
from runs.models import Source

register = template.Library()


@register.filter
def short_id(value) -> str:
    """An id by its first characters (``runs.domain.text.short_id``)."""
    return text.short_id(value)


@register.filter
def event_note(event) -> str:
    """The why of an event, if it has one: a request's reason, a stop's, or an error; for
    a decision on one tool call, what was decided, on which tool, with which arguments."""
    data = event.data or {}
    if data.get("decision"):
        note = f"{data['decision']} {data.get('tool', '')}"
        if data.get("arguments") is not None:
            shown = ", ".join(f"{name}={argument_value(value)}"
                              for name, value in data["arguments"].items())
            note += f" with {text.clipped(shown, 300)}"
        return note + (f": {data['reason']}" if data.get("reason") else "")
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


@register.filter
def pretty_json(value) -> str:
    """A JSON value as people read it: indented, keys in their order, text unescaped."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def is_text(value) -> bool:
    return isinstance(value, str)


@register.filter
def argument_value(value) -> str:
    """One argument of a tool call as people read it: text as it is, anything else as
    compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


@register.filter
def seconds_between(later, earlier) -> float | str:
    """Seconds between two times (a ``data-seconds`` the page writes out as a duration);
    "" if either is unknown."""
    if not later or not earlier:
        return ""
    return (later - earlier).total_seconds()


@register.filter
def ms_to_seconds(ms) -> float | str:
    """A duration in milliseconds (an activity entry's) as seconds, for ``data-seconds``."""
    return "" if ms is None or ms == "" else float(ms) / 1000


@register.filter
def attr_seq(entry) -> int:
    return entry.seq if entry is not None else 0


@register.filter
def activity_detail(entry) -> str:
    """The small print of an activity entry: a tool's error, the tools a model asked for,
    progress, who asked for a pause."""
    if entry is None:
        return ""
    data = entry.data or {}
    if entry.kind == "tool" and data.get("ok") is False:
        return f"failed: {data.get('error', '')}"
    if entry.kind == "model" and data.get("cancelled"):
        return "cancelled mid-call: its time until the abort, the tokens received by then"
    if entry.kind == "model" and data.get("tools"):
        return "asked for " + ", ".join(data["tools"])
    if entry.kind == "progress" and data.get("done") is not None:
        total = data.get("total")
        return f"step {data['done']} of {total}" if total else f"step {data['done']}"
    if entry.kind == "control":
        who = f"by {data['actor']}" if data.get("actor") else ""
        where = f"via {source_label(data['source'])}" if data.get("source") else ""
        return " ".join(part for part in (who, where) if part)
    if entry.kind == "log" and data:
        return json.dumps(data, ensure_ascii=False, default=str)
    return ""


@register.filter
def activity_figures(entry) -> str:
    """What an entry cost besides its time (which the page writes out from
    ``data-seconds``): "340 tokens · gen 2"."""
    if entry is None:
        return ""
    parts = [f"{entry.tokens}\u00a0tokens" if entry.tokens else "",  # each kept on one line
             f"gen\u00a0{entry.generation}" if entry.generation else ""]
    return " · ".join(part for part in parts if part)


# How a bulk job's request went, by the path ``runs.domain.runs`` answered with.
BULK_PATHS = {"live": "asked of its running attempt", "durable": "applied at once",
              "ended": "had already ended"}


@register.filter
def bulk_detail(value) -> str:
    """A bulk item's detail as people read it: the path its request took, or the domain's
    own words (a resume's, a refusal's)."""
    return BULK_PATHS.get(value or "", value or "")


@register.filter
def source_label(value) -> str:
    """A request's source as people read it ("Browser", "REST API")."""
    return dict(Source.choices).get(value, value or "")
