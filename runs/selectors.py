"""Reads: the run list, one run, and the event log."""

import base64
import uuid
from datetime import datetime

from django.db.models import Q

from runs.models import Event, Run
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
