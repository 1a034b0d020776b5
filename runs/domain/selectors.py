"""Reads: the run list, one run, and the event log."""

import base64
import math
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F, Field, Func, IntegerField, Max, Q, Value
from django.db.models.lookups import GreaterThan, LessThan
from django.utils import timezone

from runs.domain import sql
from runs.domain.errors import InvalidRequest, RunNotFound
from runs.domain.representation import PAYLOAD, change_text, snapshot_text
from runs.domain.text import quoted_id
from runs.models import (
    Activity,
    ActivityKind,
    Attempt,
    AttemptState,
    ControlIntent,
    EndCause,
    Event,
    EventKind,
    ResumeTicket,
    Run,
    RunState,
    TicketReason,
    TicketState,
    WorkerProcess,
)


def runs():
    return Run.objects.select_related("ticket", "control")


def parse_uuid(value, what: str = "run") -> uuid.UUID:
    """``value`` as a UUID; an id that is not one names nothing (``RunNotFound`` for a run,
    ``InvalidRequest`` for anything else)."""
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        if what == "run":
            raise RunNotFound(f"No run with id {quoted_id(value)}.") from None
        raise InvalidRequest(f"No {what} with id {quoted_id(value)}.", field=what) from None


def parse_run_id(value) -> uuid.UUID:
    return parse_uuid(value, "run")


def run_get(run_id) -> Run:
    """The run with its open ticket and its newest control intent, as ``runs()`` reads it.

    Every control request and every live command reads a run: its row and the two rows it
    names are read by primary key (``sql.get``), not through a compiled queryset."""
    run = sql.get(Run, parse_run_id(run_id))
    if run is None:
        raise RunNotFound(f"No run with id {quoted_id(run_id)}.")
    run.ticket = None if run.ticket_id is None else sql.get(ResumeTicket, run.ticket_id)
    run.control = None if run.control_id is None else sql.get(ControlIntent, run.control_id)
    return run


def ticket_get(ticket_id) -> ResumeTicket:
    ticket = ResumeTicket.objects.filter(pk=parse_uuid(ticket_id, "ticket")).first()
    if ticket is None:
        raise InvalidRequest(f"No ticket with id {quoted_id(ticket_id)}.", field="ticket")
    return ticket


def claim_holds(*, run_id, generation: int, owner: str) -> bool:
    """Whether ``owner``'s attempt ``generation`` still holds the run's claim, as committed:
    a durable host checks this before it lets a live command reach the attempt."""
    return sql.exists(Run, id=parse_run_id(run_id), state=RunState.RUNNING,
                      generation=generation, owner=owner)


def pending_request(*, run_id) -> ControlIntent | None:
    """The run's committed cancel or stop request not applied yet, if any: the fence a
    host checks before it lets a tool start (a request can commit before its live signal
    reaches the attempt). Read through the partial index of pending requests."""
    return (ControlIntent.objects.filter(run_id=run_id, applied_at__isnull=True)
            .only("action", "reason", "requested_by", "source", "requested_at").first())


# The orders of the run list: a sort name, ``-`` first for descending, and its column.
SORTS = {"created": "created_at", "started": "started_at", "ended": "ended_at",
         "duration": "seconds_used"}
SORT_CHOICES = [f"{sign}{name}" for name in SORTS for sign in ("-", "")]
NULLABLE = {"started_at", "ended_at"}  # a run not started (or not ended) yet: NULL
HEX_PREFIX = re.compile(r"[0-9a-f]{1,32}")


def id_range(prefix: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The lowest and highest run id that start with ``prefix`` (hex digits, dashes and
    case ignored), or None if it is not such a prefix. A range of ids, so the primary key
    index finds them."""
    digits = prefix.strip().lower().replace("-", "")
    if not HEX_PREFIX.fullmatch(digits):
        return None
    pad = 32 - len(digits)
    return uuid.UUID(digits + "0" * pad), uuid.UUID(digits + "f" * pad)


def matching(*, state=None, end_cause=None, status=(), agent=None, thread_id=None,
             parent_id=None, id_prefix=None, q=None, error=None, created_after=None,
             created_before=None, ticket_reason=None) -> Q:
    """The condition of the run-list filters, all of them together:

    * ``state``, ``end_cause``: one each; ``status``: several states or end causes, any of
      them (``["running", "failed"]``: running, or ended failed);
    * ``agent``, ``thread_id``, ``parent_id``: equal;
    * ``id_prefix``: the run id starts with it (the short id the list shows);
    * ``q``: a search: an id prefix, a thread id or an agent;
    * ``error``: failed runs whose error contains it, in any case;
    * ``ticket_reason``: awaiting runs whose open ticket has that reason (``provider``);
    * ``created_after`` (inclusive), ``created_before`` (exclusive).
    """
    condition = Q()
    for name, value in (("state", state), ("end_cause", end_cause), ("agent", agent),
                        ("thread_id", thread_id), ("parent_id", parent_id)):
        if value is not None:
            condition &= Q(**{name: value})
    if status:
        states = [value for value in status if value in RunState.values]
        causes = [value for value in status if value in EndCause.values]
        unknown = sorted(set(status) - set(states) - set(causes))
        if unknown:
            raise InvalidRequest(f"Unknown status {unknown[0]!r}: give states or end causes.",
                                 field="status")
        condition &= Q(state__in=states) | Q(end_cause__in=causes)
    if id_prefix is not None:
        bounds = id_range(id_prefix)
        if bounds is None:
            raise InvalidRequest("id_prefix must be 1 to 32 hex digits.", field="id_prefix")
        condition &= Q(pk__range=bounds)
    if q is not None and q.strip():
        text = q.strip()
        found = Q(thread_id=text) | Q(agent=text)
        bounds = id_range(text)
        if bounds is not None:
            found |= Q(pk__range=bounds)
        condition &= found
    if error is not None:
        condition &= Q(end_cause=EndCause.FAILED, error__icontains=error)
    if ticket_reason is not None:
        if ticket_reason not in TicketReason.values:
            raise InvalidRequest(f"Unknown ticket reason {str(ticket_reason)[:40]!r}; give any "
                                 f"of {', '.join(TicketReason.values)}.", field="ticket_reason")
        condition &= Q(state=RunState.AWAITING, ticket__reason=ticket_reason)
    if created_after is not None:
        condition &= Q(created_at__gte=created_after)
    if created_before is not None:
        condition &= Q(created_at__lt=created_before)
    return condition


def run_list(*, filters: dict, search: str = "", cursor: str | None = None, limit: int = 50,
             sort: str = "-created", payload_bytes: int | None = None):
    """A page of runs matching ``filters`` (the arguments of ``matching``) and ``search``,
    in the order ``sort`` (newest first by default). Returns ``(runs, next_cursor or
    None)``.

    Keyset pagination on (sort column, id): a page costs the same at any depth. A run with
    no value in the column (not started, not ended) sorts after every value, as if it
    started or ended in the future: last going up, first going down.

    With ``payload_bytes``, a run whose input and output together take more than that many
    bytes as stored comes without them (deferred: ``representation.run_data`` writes it
    truncated), so a page of large runs is never loaded whole.
    """
    column, descending = sort_column(sort)
    criteria = dict(filters)
    if search.strip():
        criteria["q"] = search
    queryset = Run.objects.filter(matching(**criteria))
    after = decode_cursor(cursor, sort) if cursor else None
    # The page's ids first, from the index alone; then their runs with ticket and control.
    # (Joined into the ordered read, the planner may join every match before it sorts.)
    ids: list = []
    for segment in _segments(queryset, column, descending, after):
        ids += segment.values_list("id", flat=True)[: limit + 1 - len(ids)]
        if len(ids) > limit:
            break
    chosen = runs() if payload_bytes is None else runs().defer(*PAYLOAD)
    found = chosen.in_bulk(ids[:limit])
    page = [found[run_id] for run_id in ids[:limit]]
    if payload_bytes is not None and page:
        _load_payloads(page, payload_bytes)
    more = len(ids) > limit
    return page, (encode_cursor(page[-1], sort) if more else None)


def runs_among(*, ids, filters: dict, search: str = "") -> list[Run]:
    """Those of the runs ``ids`` that match ``filters`` and ``search`` (as ``run_list``
    applies them): what a filtered live list asks about the runs a push named."""
    criteria = dict(filters)
    if search.strip():
        criteria["q"] = search
    return list(runs().filter(matching(**criteria), pk__in=ids))


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


class Row(Func):
    """A row value, ``(a, b)``: compared column by column, in the order of an index."""

    template = "(%(expressions)s)"
    output_field = Field()


def sort_column(sort: str) -> tuple[str, bool]:
    name = sort.removeprefix("-")
    if name not in SORTS:
        raise InvalidRequest(f"Unknown sort {sort!r}.", field="sort")
    return SORTS[name], sort.startswith("-")


def _segments(queryset, column: str, descending: bool, after):
    """The querysets that make up the order, each read from one index range: the runs with
    a value in ``column`` and, for a nullable column, those without one (after them going
    up, before them going down). ``after`` is the cursor's (value, id): each segment starts
    after it, or is skipped if the cursor has passed it."""
    sign = "-" if descending else ""
    before_or_after = "lt" if descending else "gt"
    segments = []
    values = queryset.order_by(f"{sign}{column}", f"{sign}id")
    if column in NULLABLE:
        values = values.filter(**{f"{column}__isnull": False})
        nulls = queryset.filter(**{f"{column}__isnull": True}).order_by(f"{sign}id")
    if after is None:
        segments.append(values)
    elif after[0] is not None:
        value, run_id = after
        # (column, id) beyond the cursor as one row comparison, which the index scan starts
        # at: an OR of its parts would skip, one by one, every run that ties on the value.
        edge = "lte" if descending else "gte"
        beyond = LessThan if descending else GreaterThan
        cursor = Row(Value(value, output_field=Run._meta.get_field(column)),
                     Value(run_id, output_field=Run._meta.pk))
        segments.append(values.filter(**{f"{column}__{edge}": value}).filter(
            beyond(Row(F(column), F("id")), cursor)))
    elif descending:  # the cursor is among the NULLs, which come first going down
        segments.append(values)
    if column not in NULLABLE:
        return segments
    if after is None or (after[0] is not None and not descending):
        nulls_segment = nulls
    elif after[0] is None:
        nulls_segment = nulls.filter(**{f"id__{before_or_after}": after[1]})
    else:  # going down, the NULLs came before the cursor's value
        return segments
    return [nulls_segment, *segments] if descending else [*segments, nulls_segment]


def encode_cursor(run: Run, sort: str = "-created") -> str:
    """The cursor of the page after ``run`` in the order ``sort``."""
    column, _ = sort_column(sort)
    value = getattr(run, column)
    if sort == "-created":  # the list's first format, still understood
        raw = f"{value.isoformat()}|{run.id}"
    else:
        text = "" if value is None else repr(value) if isinstance(value, float) \
            else value.isoformat()
        raw = f"{sort}|{text}|{run.id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, sort: str = "-created"):
    """The (value, id) a cursor of the order ``sort`` holds; InvalidRequest for anything
    this API did not give out for that order."""
    column, _ = sort_column(sort)
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        parts = raw.split("|")
        if len(parts) == 2:
            parts = ["-created", *parts]
        given, text, run_id = parts
        if given != sort:
            raise ValueError(given)
        if text == "" and column in NULLABLE:
            value = None
        elif column == "seconds_used":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
        else:
            value = datetime.fromisoformat(text)
            if value.tzinfo is None:
                raise ValueError(text)
        return value, uuid.UUID(run_id)
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest("The cursor is not one this API gave out.", field="cursor") from None


def run_events(*, run: Run, after: int = 0, limit: int = 1000):
    """The run's events after seq ``after``, in order, ``limit`` at most."""
    return list(run.events.filter(seq__gt=after).order_by("seq")[:limit])


def events_after(*, after: int = 0, limit: int = 100):
    return list(Event.objects.filter(seq__gt=after).order_by("seq")[:limit])


@dataclass(frozen=True)
class Resumed:
    """The resume an attempt follows, while it awaits the agent's next committed step."""

    reason: str  # the ticket's
    input: object  # the resume input (for an approval: the checked decision)
    action: dict | None = None  # the one tool call an approval ticket was bound to
    actor: str | None = None  # who resumed it


@dataclass(frozen=True)
class AttemptView:
    """What an attempt needs to know of its run when it starts."""

    agent: str
    input: dict
    parent_id: str | None
    agent_state: dict | None
    resume: Resumed | None  # the resume this attempt follows, until its next step commits
    steps: int
    tokens: int
    seconds_used: float
    max_steps: int | None
    max_seconds: float | None
    max_tokens: int | None
    cost_usd: float | None = 0.0
    max_cost_usd: float | None = None
    max_repeats: int | None = None
    on_exhausted: str = "stop"
    repeats: dict | None = None  # committed tool calls by digest (counted with max_repeats)
    thread_id: str = ""
    traceparent: str = ""  # the trace context of the request that created the run


def attempt_view(*, run: Run, generation: int) -> AttemptView:
    """The view of ``run`` as its attempt ``generation`` claimed it (the claim's own copy).

    A resume's input reaches every attempt until the agent commits its next step (SPEC
    §7.11): an attempt that follows a crash right after a resume gets it too.
    """
    ticket = None
    if generation > 1:  # a first attempt follows no resume
        resumed = (ResumeTicket.objects.filter(run_id=run.pk, state=TicketState.CONSUMED)
                   .order_by("-closed_at").values_list("generation", "reason", "resume_input",
                                                        "action", "closed_by")
                   .first())
        if resumed is not None and not Event.objects.filter(
                run_id=run.pk, kind=EventKind.STEP, generation__gt=resumed[0]).exists():
            ticket = Resumed(*resumed[1:])
    return AttemptView(
        agent=run.agent, input=run.input or {},
        parent_id=None if run.parent_id is None else str(run.parent_id),
        agent_state=run.agent_state,
        resume=ticket, steps=run.steps, tokens=run.tokens,
        seconds_used=run.seconds_used, max_steps=run.max_steps, max_seconds=run.max_seconds,
        max_tokens=run.max_tokens, cost_usd=run.cost_usd, max_cost_usd=run.max_cost_usd,
        max_repeats=run.max_repeats, on_exhausted=run.on_exhausted, repeats=run.repeats or {},
        thread_id=run.thread_id, traceparent=run.traceparent,
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
        # A run too large to push is sent truncated: its input and output are not loaded.
        page, _ = run_list(filters={}, limit=SNAPSHOT_SIZE,
                           payload_bytes=settings.AWAKEN_PUSH_RUN_BYTES)
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
    # As in a snapshot, the input and output of runs too large to push are not loaded.
    current = {run.id: run for run in runs().defer(*PAYLOAD).filter(
        pk__in={e.run_id for e in page})}
    _load_payloads(list(current.values()), settings.AWAKEN_PUSH_RUN_BYTES)
    return [change_text(run=current[e.run_id], event=e) for e in page]


# A run's page shows its newest events and its first descendants, this many at most
# (the events API pages through all of them), so it costs the same for a run of any size.
PAGE_EVENTS = 200
PAGE_TREE = 200
# The events after which a run is in a new state (a step or a request changes none).
STATE_KINDS = (EventKind.CREATED, EventKind.STARTED, EventKind.PAUSED, EventKind.RESUMED,
               EventKind.REQUEUED, EventKind.ENDED)


# The parts of a run's page, which its live updates fetch one by one (``run_page(parts=)``).
PAGE_PARTS = ("summary", "ask", "trace", "io", "requests", "timeline", "attempts", "tree")


def run_page(*, run_id, parts=PAGE_PARTS, after: int | None = None, rows=None) -> dict:
    """What a run's page shows: the run, its newest ``PAGE_EVENTS`` events (and its
    newest state changes, which date its state), attempts, tickets, control requests, and
    the first ``PAGE_TREE`` of its descendants. With ``parts``, only what those parts
    show; with ``after``, the timeline's events after that seq; with ``rows``, those of
    the named runs that are in its tree, with their depth."""
    run = run_get(run_id)
    page = {"run": run}
    if {"summary", "requests", "trace"} & set(parts):
        page["state_events"] = list(run.events.filter(kind__in=STATE_KINDS)
                                    .order_by("-seq")[:PAGE_EVENTS])[::-1]
    if "timeline" in parts:
        events = run.events if after is None else run.events.filter(seq__gt=after)
        page["events"] = list(events.order_by("-seq")[:PAGE_EVENTS])[::-1]
        # Older than what the page shows: the page keeps the newest PAGE_EVENTS.
        shown = len(page["events"]) if after is None else PAGE_EVENTS
        page["events_hidden"] = max(0, run.version - shown)
    if {"attempts", "trace"} & set(parts):
        page["attempts"] = list(run.attempts.order_by("generation"))
    if {"requests", "trace"} & set(parts):
        page["intents"] = list(run.intents.order_by("requested_at"))
    if "trace" in parts:  # the resumes it draws are among the page's newest events
        page["trace_events"] = (page["events"] if "timeline" in parts and after is None
                                else list(run.events.order_by("-seq")[:PAGE_EVENTS])[::-1])
    if "tree" in parts:
        tree = run_tree(run, most=PAGE_TREE)
        page.update(tree=tree, tree_cut=len(tree) >= PAGE_TREE,
                    tree_ids=[str(run.id), *(str(child.id) for _, child in tree)])
    if rows is not None:
        page["rows"] = tree_rows(run, rows)
    return page


def tree_rows(run: Run, ids) -> list[tuple[int, Run]]:
    """Those of the runs ``ids`` that descend from ``run`` within the levels its page shows,
    each with its depth under it (0: a child), in the order asked."""
    found = {child.id: child for child in runs().filter(pk__in=ids)}
    parents = {child_id: child.parent_id for child_id, child in found.items()}
    depths = {}
    for child_id in found:
        depth, parent = 0, parents[child_id]
        while parent is not None and parent != run.id and depth < 5:
            if parent not in parents:  # an ancestor not read yet
                parents.update(runs().filter(pk=parent).values_list("id", "parent_id"))
            depth, parent = depth + 1, parents.get(parent)
        if parent == run.id:
            depths[child_id] = depth
    return [(depths[child.id], child) for child in (found.get(i) for i in ids)
            if child is not None and child.id in depths]


def run_tree(run: Run, *, levels: int = 5, most: int | None = None) -> list[tuple[int, Run]]:
    """The run's descendants, depth-first with their depth; one query per level, and at
    most ``most`` descendants (the nearer levels first)."""
    children_of: dict = {}
    frontier = [run.id]
    found = 0
    for _ in range(levels):
        if most is not None and found >= most:
            break
        level = runs().filter(parent_id__in=frontier).order_by("created_at")
        level = list(level if most is None else level[:most - found])
        found += len(level)
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


@dataclass(frozen=True)
class Pending:
    """A request a run took that has not applied yet: a pause waiting for its step boundary,
    a cancel or stop not yet committed. ``step_since``: when the step it waits on began."""

    action: str
    step_since: datetime | None


def pending_requests(runs_shown) -> dict:
    """For the live runs among ``runs_shown``: run id -> Pending, from committed state (a
    pending cancel or stop is the run's unapplied control request; a pending pause is one
    its current attempt took, as it is still running: a pause ends the attempt)."""
    live = [run for run in runs_shown if run.state != RunState.ENDED]
    found = {}
    for run in live:
        control = run.control if run.control_id is not None else None
        if control is not None and control.applied_at is None:
            found[run.id] = control.action
    running = {run.id: run.generation for run in live
               if run.state == RunState.RUNNING and run.id not in found}
    if running:
        taken = (Activity.objects.filter(run_id__in=running, kind=ActivityKind.CONTROL)
                 .values_list("run_id", "generation", "data"))
        for run_id, generation, data in taken:
            if generation == running[run_id] and (data or {}).get("action") == "pause":
                found[run_id] = "pause"
    if not found:
        return {}
    begun = dict(Event.objects.filter(run_id__in=found,
                                      kind__in=(EventKind.STARTED, EventKind.STEP))
                 .values("run_id").annotate(last=Max("at")).values_list("run_id", "last"))
    return {run_id: Pending(action, begun.get(run_id)) for run_id, action in found.items()}


def workers() -> list[WorkerProcess]:
    """Every worker process that reported within the last hour, alive ones first: each with
    ``alive`` (renewed within a lease), ``attempts`` (its live attempts, with their runs)."""
    found = list(WorkerProcess.objects.order_by("-reported_at", "owner"))
    lost_before = timezone.now() - timedelta(seconds=settings.AWAKEN_LEASE_SECONDS)
    live = {}
    for attempt in (Attempt.objects.filter(state=AttemptState.LIVE,
                                           owner__in=[w.owner for w in found])
                    .select_related("run").order_by("started_at")):
        live.setdefault(attempt.owner, []).append(attempt)
    for worker in found:
        worker.alive = worker.reported_at >= lost_before
        worker.attempts = live.get(worker.owner, [])
    return sorted(found, key=lambda w: (not w.alive, w.owner))
