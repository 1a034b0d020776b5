"""A run's trace: its attempts, their steps, the model and tool calls of each step, and the
control requests, on one time axis, as the run's page draws it (a waterfall).

Read from what is recorded: the attempts, the activity log (``runs.domain.activity``:
steps, model and tool calls with their start and duration, errors), the control requests
(cancel and stop intents, pauses the attempts took), the live deliveries they took (a
message, a wake) and the events (resumes). A call the attempt was stopped in the
middle of is in the log too, marked ``cancelled``, with the time until the abort and the
tokens received by then.

Bounded: the newest ``ENTRIES`` entries are read, and at most ``ROWS`` rows are drawn;
steps alike in a row (the same calls, ``REPEATS`` of them or more) are drawn as one row
that opens on its members.
"""

from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

from runs.domain import activity
from runs.models import Activity, ActivityKind, EventKind, RunState, Source

ENTRIES = 1000  # the newest activity entries the trace reads
ROWS = 200  # rows drawn, members of collapsed steps included
REPEATS = 3  # steps alike in a row collapsed into one from this many on
MEMBERS = 20  # members of a collapsed group drawn when it is opened
SCALE = 1000  # positions are per mille of the axis
MIN_WIDTH = 4  # a span is drawn at least this wide, so a short call shows
INSTANT = 6  # the width of the mark of an instant
KINDS = (ActivityKind.STEP, ActivityKind.MODEL, ActivityKind.TOOL, ActivityKind.ERROR,
         ActivityKind.CONTROL)


@dataclass
class Row:
    kind: str  # run, attempt, step, steps (alike steps collapsed), model, tool, error, control
    level: int  # 0 the run, 1 an attempt or a request, 2 a step, 3 a call of a step
    label: str
    start: datetime
    end: datetime | None = None  # None: an instant (an error, a resume, a delivery)
    tokens: int | None = None
    note: str = ""
    outcome: str = ""  # ok, failed, cancelled, live (still going), pending, or ""
    generation: int | None = None
    actor: str | None = None
    source: str | None = None
    members: list["Row"] = field(default_factory=list)
    count: int = 0  # a collapsed group's steps
    left: int = 0
    width: int = 0
    signature: tuple = ()
    offset: float = 0.0  # seconds from the start of the axis (set by ``place``)

    @property
    def seconds(self) -> float | None:
        return None if self.end is None else max(0.0, (self.end - self.start).total_seconds())

    def place(self, start: datetime, seconds: float) -> None:
        """Put the row on the axis that starts at ``start`` and lasts ``seconds``."""
        self.offset = max(0.0, (self.start - start).total_seconds())
        self.left = min(SCALE, round(SCALE * self.offset / seconds))
        if self.end is not None:
            self.width = min(SCALE, max(MIN_WIDTH, round(SCALE * (self.seconds or 0) / seconds)))
            self.left = min(self.left, SCALE - self.width)
        else:  # a mark centred on the instant
            self.width = INSTANT
            self.left = max(0, min(self.left - INSTANT // 2, SCALE - INSTANT))
        for member in self.members:
            member.place(start, seconds)


def _entry_row(entry: Activity, level: int) -> Row:
    data = entry.data if isinstance(entry.data, dict) else {}
    end = None if entry.ms is None else entry.at + timedelta(milliseconds=entry.ms)
    if entry.kind == ActivityKind.ERROR:
        return Row("error", level, "Error", entry.at, note=entry.text, outcome="failed",
                   generation=entry.generation)
    outcome, note, tokens = "ok", "", entry.tokens
    if data.get("cancelled"):
        outcome, tokens = "cancelled", data.get("received", tokens)  # 0 is kept there
        note = "cut short: its time until the abort, the tokens received by then"
    elif data.get("refused"):
        outcome, note = "failed", "refused: a cancel or stop was asked first"
    elif data.get("ok") is False:
        outcome, note = "failed", f"failed: {data.get('error', '')}".rstrip(": ")
    elif entry.kind == ActivityKind.MODEL and data.get("tools"):
        note = "asked for " + ", ".join(str(name) for name in data["tools"])
    kind = {ActivityKind.MODEL: "model", ActivityKind.TOOL: "tool"}.get(entry.kind, "step")
    if kind == "step":
        label = (entry.text or "step").capitalize()  # "Step 4"
    else:
        label = f"{'Model call' if kind == 'model' else 'Tool call'} {entry.text}".strip()
    return Row(kind, level, label, entry.at, end, tokens=tokens, note=note,
               outcome=outcome, generation=entry.generation,
               signature=(kind, entry.text, outcome))


def _attempt_children(attempt, entries: list[Activity]) -> list[Row]:
    """The steps of one attempt with their calls under them; the calls no committed step
    holds (the step the attempt stopped in, say) stand on their own."""
    steps = [_entry_row(entry, 2) for entry in entries if entry.kind == ActivityKind.STEP]
    steps.sort(key=lambda row: row.start)
    starts = [row.start for row in steps]
    loose = []
    for entry in entries:
        if entry.kind == ActivityKind.STEP:
            continue
        index = bisect_right(starts, entry.at) - 1
        holder = steps[index] if index >= 0 else None
        if holder is not None and holder.end is not None and entry.at <= holder.end:
            holder.members.append(_entry_row(entry, 3))
        else:
            loose.append(_entry_row(entry, 2))
    for step in steps:
        step.signature = tuple(member.signature for member in step.members)
    return sorted([*_collapsed(steps), *loose], key=lambda row: row.start)


def _collapsed(steps: list[Row]) -> list[Row]:
    """Steps alike in a row (the same calls, each ending the same way), ``REPEATS`` or more,
    as one row of kind ``steps`` whose members are the steps."""
    rows, index = [], 0
    while index < len(steps):
        end = index
        while end + 1 < len(steps) and steps[end + 1].signature == steps[index].signature:
            end += 1
        alike = steps[index:end + 1]
        if len(alike) >= REPEATS:
            first, last = alike[0], alike[-1]
            tokens = sum(step.tokens or 0 for step in alike)
            rows.append(Row("steps", 2, f"{first.label}–{last.label.split(' ')[-1]}"
                            if first.label != last.label else first.label,
                            first.start, max(step.end or step.start for step in alike),
                            tokens=tokens,
                            note=_calls_text(first), outcome=last.outcome, count=len(alike),
                            generation=first.generation, members=alike))
        else:
            rows.extend(alike)
        index = end + 1
    return rows


def _calls_text(step: Row) -> str:
    names = [member.label for member in step.members]
    return ("each: " + ", ".join(names)) if names else "no calls"


def _request_rows(requests: list[dict], events: list, deliveries: list[Activity]) -> list[Row]:
    """The control requests: cancels, stops and pauses from asked until applied, and the
    resumes and the live deliveries the attempts took (a message, a wake, a live cancel)
    as instants."""
    rows = [Row("control", 1, f"{row['action'].capitalize()} requested", row["at"],
                row["committed"], actor=row["by"] or None, source=row["source"] or None,
                outcome="ok" if row["committed"] else "pending",
                note="" if row["committed"] else "not applied yet")
            for row in requests if row["at"] is not None]
    rows += [Row("control", 1, "Resumed", event.at, actor=event.actor,
                 source=event.get_source_display() if event.source else None,
                 generation=event.generation)
             for event in events if event.kind == EventKind.RESUMED]
    sources = dict(Source.choices)
    for entry in deliveries:
        data = entry.data or {}
        rows.append(Row("control", 1, entry.text.capitalize(), entry.at,
                        actor=data.get("actor"), source=sources.get(data.get("source")),
                        generation=entry.generation))
    for row in rows:
        row.signature = ("control", row.label)
    return rows


def run_trace(run, *, attempts: list, requests: list[dict], events: list,
              now: datetime | None = None) -> dict:
    """The run's trace: ``rows`` in reading order, each placed on the axis (``left`` and
    ``width`` per mille), the axis (``seconds``, its ``ticks``), and what was left out
    (``rows_hidden``, ``entries_hidden``). ``requests``: the page's control requests
    (``runs.pages.views.control_rows``); ``events``: the page's events."""
    now = now or timezone.now()
    entries = list(Activity.objects.filter(run_id=run.pk, kind__in=KINDS)
                   .order_by("-seq")[:ENTRIES])[::-1]
    entries_hidden = 0
    if len(entries) == ENTRIES:
        entries_hidden = Activity.objects.filter(run_id=run.pk, kind__in=KINDS,
                                                 seq__lt=entries[0].seq).count()
    by_generation: dict[int, list[Activity]] = {}
    deliveries = []  # the pauses are among the page's requests already
    for entry in entries:
        if entry.kind != ActivityKind.CONTROL:
            by_generation.setdefault(entry.generation, []).append(entry)
        elif not activity.is_pause(entry):
            deliveries.append(entry)
    body: list[Row] = []
    for attempt in attempts:
        closed = attempt.closed_at
        row = Row("attempt", 1, f"Attempt {attempt.generation}", attempt.started_at,
                  closed or now, outcome=attempt.close_reason or "live",
                  note=f"on {attempt.owner}", generation=attempt.generation)
        row.members = _attempt_children(attempt, by_generation.get(attempt.generation, []))
        body.append(row)
    for request in _request_rows(requests, events, deliveries):
        during = next((row for row in reversed(body) if row.kind == "attempt"
                       and row.start <= request.start <= row.end), None)
        if during is None:
            body.append(request)
        else:  # among the attempt's steps, where it happened
            request.level = 2
            during.members.append(request)
            during.members.sort(key=lambda row: row.start)
    body.sort(key=lambda row: (row.start, row.level))
    recorded = [row.end or row.start for row in _walk(body)]
    end = max([run.ended_at or now, *recorded])
    root = Row("run", 0, f"Run {run.agent}", run.created_at, end,
               tokens=run.tokens or None, outcome=run.end_cause or run.state)
    start = root.start
    # The axis ends with the run, or now while it runs; a run waiting (awaiting, queued
    # again) has its axis end with the last thing recorded, so a long wait does not
    # squeeze what happened (its own bar goes on past the end).
    waiting = run.ended_at is None and run.state != RunState.RUNNING and recorded
    latest = max(recorded) if waiting else end
    seconds = max((latest - start).total_seconds(), 0.001)
    rows = [root, *_flattened(body)]
    shown, hidden = _capped(rows)
    for row in shown:
        row.place(start, seconds)
    return {"rows": shown, "rows_hidden": hidden, "entries_hidden": entries_hidden,
            "seconds": seconds, "start": start,
            "ticks": [seconds * part / 4 for part in range(5)]}


def _walk(rows: list[Row]):
    for row in rows:
        yield row
        yield from _walk(row.members)


def _flattened(rows: list[Row]) -> list[Row]:
    """Attempts and steps with their members right under them; a collapsed group keeps its
    members inside (the page opens it)."""
    flat = []
    for row in rows:
        flat.append(row)
        if row.kind in ("attempt", "step"):
            flat.extend(_flattened(row.members))
            row.members = []
    return flat


def _capped(rows: list[Row]) -> tuple[list[Row], int]:
    """At most ``ROWS`` rows, each collapsed group's members counted (up to ``MEMBERS`` of
    them drawn, without their calls, which the group names): the first ones, with how many
    are left out."""
    shown, used = [], 0
    for index, row in enumerate(rows):
        if row.kind == "steps":
            row.members = row.members[:MEMBERS]
        size = 1 + len(row.members)
        if used + size > ROWS and shown:
            return shown, len(rows) - index
        shown.append(row)
        used += size
    return shown, 0
