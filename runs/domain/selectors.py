"""Reads: the run list, one run, and the event log."""

import base64
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Func, IntegerField, Q

from runs.domain.errors import InvalidRequest, RunNotFound
from runs.domain.representation import PAYLOAD, change_text, snapshot_text
from runs.models import Event, EventKind, ResumeTicket, Run, RunState, TicketState


def runs():
    return Run.objects.select_related("ticket", "control")


def parse_uuid(value, what: str = "run") -> uuid.UUID:
    """``value`` as a UUID; an id that is not one names nothing (``RunNotFound`` for a run,
    ``InvalidRequest`` for anything else)."""
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        if what == "run":
            raise RunNotFound(f"No run with id {value}.") from None
        raise InvalidRequest(f"No {what} with id {value}.", field=what) from None


def parse_run_id(value) -> uuid.UUID:
    return parse_uuid(value, "run")


def run_get(run_id) -> Run:
    run = runs().filter(pk=parse_run_id(run_id)).first()
    if run is None:
        raise RunNotFound(f"No run with id {run_id}.")
    return run


def ticket_get(ticket_id) -> ResumeTicket:
    ticket = ResumeTicket.objects.filter(pk=parse_uuid(ticket_id, "ticket")).first()
    if ticket is None:
        raise InvalidRequest(f"No ticket with id {ticket_id}.", field="ticket")
    return ticket


def claim_holds(*, run_id, generation: int, owner: str) -> bool:
    """Whether ``owner``'s attempt ``generation`` still holds the run's claim, as committed:
    a durable host checks this before it lets a live command reach the attempt."""
    return Run.objects.filter(pk=parse_run_id(run_id), state=RunState.RUNNING,
                              generation=generation, owner=owner).exists()


def run_list(*, filters: dict, search: str = "", cursor: str | None = None, limit: int = 50,
             payload_bytes: int | None = None):
    """A page of runs, newest first. Returns ``(runs, next_cursor or None)``.

    ``search`` matches a run id exactly or a thread id. Keyset pagination on
    (created_at, id): a page costs the same at any depth. With ``payload_bytes``, a run
    whose input and output together take more than that many bytes as stored comes without
    them (deferred: ``representation.run_data`` writes it truncated), so a page of large
    runs is never loaded whole.
    """
    queryset = runs().filter(**filters).order_by("-created_at", "-id")
    if payload_bytes is not None:
        queryset = queryset.defer(*PAYLOAD)
    search = search.strip()
    if search:
        try:
            queryset = queryset.filter(Q(pk=uuid.UUID(search)) | Q(thread_id=search))
        except ValueError:
            queryset = queryset.filter(thread_id=search)
    if cursor:
        created_at, run_id = decode_cursor(cursor)
        # (created_at, id) < (cursor): the first condition alone is what lets the index
        # scan start at the cursor instead of skipping every newer run to reach it.
        queryset = queryset.filter(created_at__lte=created_at).filter(
            Q(created_at__lt=created_at) | Q(id__lt=run_id)
        )
    page = list(queryset[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    if payload_bytes is not None and page:
        _load_payloads(page, payload_bytes)
    return page, (encode_cursor(page[-1]) if more else None)


class StoredBytes(Func):
    """The bytes a JSON column takes as text (0 for SQL NULL), computed by the database."""

    template = "COALESCE(OCTET_LENGTH((%(expressions)s)::text), 0)"
    output_field = IntegerField()

    def as_sqlite(self, compiler, connection, **extra):
        # SQLite keeps JSON as text; a BLOB's length is its bytes, a text's its characters.
        return self.as_sql(compiler, connection,
                           template="COALESCE(LENGTH(CAST(%(expressions)s AS BLOB)), 0)", **extra)


def _load_payloads(page: list[Run], limit: int) -> None:
    """Load the input and output of the runs of ``page`` where they take at most ``limit``
    bytes together; the others keep them deferred. One query over the page's rows: measured
    in the page's own query, every row the page was sorted from would be measured."""
    small = (Run.objects.filter(pk__in=[run.pk for run in page])
             .alias(size=StoredBytes("input") + StoredBytes("output"))
             .filter(size__lte=limit).order_by().values_list("pk", "input", "output"))
    loaded = {pk: (input, output) for pk, input, output in small}
    for run in page:
        if run.pk in loaded:
            run.input, run.output = loaded[run.pk]


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
    parent_id: str | None
    agent_state: dict | None
    resume: tuple | None  # (ticket reason, resume input) while a resume awaits its next step
    steps: int
    tokens: int
    seconds_used: float
    max_steps: int | None
    max_seconds: float | None
    max_tokens: int | None


def attempt_view(*, run: Run, generation: int) -> AttemptView:
    """The view of ``run`` as its attempt ``generation`` claimed it (the claim's own copy).

    A resume's input reaches every attempt until the agent commits its next step (SPEC
    §7.11): an attempt that follows a crash right after a resume gets it too.
    """
    ticket = None
    if generation > 1:  # a first attempt follows no resume
        resumed = (ResumeTicket.objects.filter(run_id=run.pk, state=TicketState.CONSUMED)
                   .order_by("-closed_at").values_list("generation", "reason", "resume_input")
                   .first())
        if resumed is not None and not Event.objects.filter(
                run_id=run.pk, kind=EventKind.STEP, generation__gt=resumed[0]).exists():
            ticket = resumed[1:]
    return AttemptView(
        agent=run.agent, input=run.input or {},
        parent_id=None if run.parent_id is None else str(run.parent_id),
        agent_state=run.agent_state,
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


SNAPSHOT_SIZE = 50
REPLAY_LIMIT = 1000
# Sequence numbers are taken before commit, so a transaction can commit after a later one:
# a resume replays this much before the client's last seq too (clients drop what they have).
REPLAY_OVERLAP = timedelta(seconds=2)


def socket_snapshot(*, run_id=None) -> str:
    """What a socket sends first, encoded: the newest seq, then the runs (the list's first
    page, or the one run)."""
    seq = Event.objects.order_by("-seq").values_list("seq", flat=True).first() or 0
    if run_id is not None:
        page = [run_get(run_id)]
    else:
        page, _ = run_list(filters={}, limit=SNAPSHOT_SIZE)
    return snapshot_text(seq=seq, runs=page)


def replay(*, after: int, run_id=None) -> list[str]:
    """Encoded ``run.changed`` messages for the committed events after ``after``, in seq
    order, each with its run as committed now; a snapshot instead if there are too many."""
    events = Event.objects.all()
    if run_id is not None:
        events = events.filter(run_id=run_id)
    anchor = events.filter(seq__lte=after).order_by("-seq").values_list("at", flat=True).first()
    window = Q(seq__gt=after)
    if anchor is not None:
        window |= Q(seq__lte=after, at__gte=anchor - REPLAY_OVERLAP)
    page = list(events.filter(window).order_by("seq")[: REPLAY_LIMIT + 1])
    if len(page) > REPLAY_LIMIT:
        return [socket_snapshot(run_id=run_id)]
    current = {run.id: run for run in runs().filter(pk__in={e.run_id for e in page})}
    return [change_text(run=current[e.run_id], event=e) for e in page]


def run_page(*, run_id) -> dict:
    """Everything a run's page shows: the run, its timeline, attempts, tickets, control
    requests, and the tree of its descendants."""
    run = run_get(run_id)
    tree = run_tree(run)
    return {
        "run": run,
        "events": list(run.events.order_by("seq")),
        "attempts": list(run.attempts.order_by("generation")),
        "tickets": list(run.tickets.order_by("created_at")),
        "intents": list(run.intents.order_by("requested_at")),
        "tree": tree,
        "tree_ids": [str(run.id), *(str(child.id) for _, child in tree)],
    }


def run_tree(run: Run, *, levels: int = 5) -> list[tuple[int, Run]]:
    """The run's descendants, depth-first with their depth; one query per level."""
    children_of: dict = {}
    frontier = [run.id]
    for _ in range(levels):
        level = list(runs().filter(parent_id__in=frontier).order_by("created_at"))
        if not level:
            break
        for child in level:
            children_of.setdefault(child.parent_id, []).append(child)
        frontier = [child.id for child in level]
    tree = []

    def walk(parent_id, depth):
        for child in children_of.get(parent_id, []):
            tree.append((depth, child))
            walk(child.id, depth + 1)

    walk(run.id, 0)
    return tree
