"""Reads: the run list, one run, and the event log."""

import base64
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q

from runs.models import Event, ResumeTicket, Run, TicketState
from runs.services.errors import InvalidRequest, RunNotFound


def runs():
    return Run.objects.select_related("ticket", "control")


def parse_run_id(value) -> uuid.UUID:
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        raise RunNotFound(f"No run with id {value}.") from None


def run_get(run_id) -> Run:
    run = runs().filter(pk=parse_run_id(run_id)).first()
    if run is None:
        raise RunNotFound(f"No run with id {run_id}.")
    return run


def run_list(*, filters: dict, cursor: str | None = None, limit: int = 50):
    """A page of runs, newest first. Returns ``(runs, next_cursor or None)``.

    Keyset pagination on (created_at, id): a page costs the same at any depth.
    """
    queryset = runs().filter(**filters).order_by("-created_at", "-id")
    if cursor:
        created_at, run_id = decode_cursor(cursor)
        queryset = queryset.filter(
            Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=run_id)
        )
    page = list(queryset[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    return page, (encode_cursor(page[-1]) if more else None)


def encode_cursor(run: Run) -> str:
    raw = f"{run.created_at.isoformat()}|{run.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str):
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, run_id = raw.split("|")
        return datetime.fromisoformat(created_at), uuid.UUID(run_id)
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("The cursor is not one this API gave out.", field="cursor") from None


def run_events(*, run: Run, after: int = 0):
    return list(run.events.filter(seq__gt=after).order_by("seq"))


def events_after(*, after: int = 0, limit: int = 100):
    return list(Event.objects.filter(seq__gt=after).order_by("seq")[:limit])


@dataclass(frozen=True)
class AttemptView:
    """What an attempt needs to know of its run when it starts."""

    agent: str
    input: dict
    agent_state: dict | None
    resume: tuple | None  # (ticket reason, resume input) when the attempt follows a resume
    steps: int
    tokens: int
    seconds_used: float
    max_steps: int | None
    max_seconds: float | None
    max_tokens: int | None


def attempt_view(*, run_id, generation: int) -> AttemptView:
    run = Run.objects.get(pk=run_id)
    ticket = (ResumeTicket.objects.filter(run_id=run_id, generation=generation - 1,
                                          state=TicketState.CONSUMED)
              .values_list("reason", "resume_input").first())
    return AttemptView(
        agent=run.agent, input=run.input or {}, agent_state=run.agent_state,
        resume=tuple(ticket) if ticket else None, steps=run.steps, tokens=run.tokens,
        seconds_used=run.seconds_used, max_steps=run.max_steps, max_seconds=run.max_seconds,
        max_tokens=run.max_tokens,
    )


def run_ends(*, run_ids) -> list[dict]:
    """The committed end of each run, in the order given."""
    rows = {str(r["id"]): r for r in Run.objects.filter(pk__in=run_ids).values(
        "id", "state", "end_cause", "stop_code")}
    return [{"id": str(run_id), **{k: v for k, v in rows[str(run_id)].items() if k != "id"}}
            for run_id in run_ids if str(run_id) in rows]
