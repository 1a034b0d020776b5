"""A run's activity log: steps, model calls, tool calls and the agent's own lines.

It is a record of what happened, not state: no transition reads it. The worker writes the
entries of an attempt with the transition they precede (a step, a pause, the end: ``staged``
rows in that transition's statement), or a few at a time on their own when the attempt goes
a while without one (``runs.runtime.activity_writer``); a live command the attempt took is
noted when it is taken; and each entry is pushed to the run's sockets after commit. The
run's row holds the log's last number and counts (``COUNTERS``), so no write counts the log.

A run keeps at most ``CAP`` of the agent's entries (steps, calls, lines, progress): the
next one is a ``truncated`` note, and later ones are dropped, so a chatty agent cannot fill
the table. The entries that are not the agent's to spend, the error that
failed an attempt and the live requests the attempts took (one per operator pause), are
counted apart, up to ``APART_CAP``: a run at its cap still shows why it failed, and pauses
never use up the agent's room.
"""

import json
from functools import partial

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from runs.domain import outside, sql
from runs.domain.representation import activity_data
from runs.domain.text import clipped
from runs.models import Activity, ActivityKind, Run

CAP = 2000  # the agent's entries per run
APART_CAP = 500  # error and control entries per run, besides
AGENT_KINDS = (ActivityKind.STEP, ActivityKind.MODEL, ActivityKind.TOOL, ActivityKind.LOG,
               ActivityKind.PROGRESS)
APART_KINDS = (ActivityKind.ERROR, ActivityKind.CONTROL)
KINDS = tuple(ActivityKind.values)  # read once: the enum makes the list anew on each read
TEXT = 500  # characters of a line (the column's size)
DATA = 2000  # bytes of an entry's data, encoded; a larger one is cut down to a note
TRACEBACK = 8000  # characters of a traceback kept in an error entry


def _clean(entry: dict) -> dict:
    data = entry.get("data") or None
    if data is not None:
        limit = TRACEBACK + DATA if entry["kind"] == ActivityKind.ERROR else DATA
        encoded = json.dumps(data, default=str)
        data = json.loads(encoded) if len(encoded) <= limit else {
            "truncated": True, "bytes": len(encoded)}
    tokens = entry.get("tokens")
    return {"kind": entry["kind"], "text": clipped(str(entry.get("text") or ""), TEXT),
            "ms": None if entry.get("ms") is None else round(float(entry["ms"]), 2),
            "tokens": int(tokens) if tokens else None, "data": data,
            "at": entry.get("at") or timezone.now()}


def activity_record(*, run_id, generation: int, entries: list[dict]) -> list[Activity]:
    """Append ``entries`` (dicts of kind, text, ms, tokens, data, at) to the run's log in a
    transaction of their own, and push them after commit. Returns the rows written (fewer
    once the run is at its cap). Entries written just before a transition go in the
    transition's own statement instead (its ``activity``)."""
    if not entries:
        return []
    with transaction.atomic():
        try:
            run = sql.lock(Run, Run._meta.pk.to_python(run_id))
        except ValidationError:  # not a UUID
            run = None
        if run is None:
            return []
        return append(run, generation, entries)


def append(run: Run, generation: int, entries: list[dict]) -> list[Activity]:
    """Write ``entries`` of attempt ``generation`` to the log of ``run``, which the caller's
    transaction has locked, in one statement; push them after commit."""
    rows = staged(run, generation, entries)
    if rows:
        sql.write(sql.Update(run, COUNTERS), sql.Insert(tuple(rows)))
        published(run.pk, rows)
    return rows


COUNTERS = ("activity_last", "activity_agent", "activity_apart")  # the run's fields


def staged(run: Run, generation: int, entries: list[dict]) -> list[Activity]:
    """The rows to insert for what the caps leave of ``entries`` (the agent's up to
    ``CAP``, then one ``truncated`` note; errors and controls up to ``APART_CAP``, whatever
    the agent wrote), numbered after the run's last. ``run`` is locked by the caller's
    transaction (the row lock numbers a run's entries one writer at a time: the worker, and
    a web process noting a live command): its ``COUNTERS`` are moved on to match, and the
    caller writes them with the rows, in the same statement."""
    for kind in {entry["kind"] for entry in entries}:
        if kind not in KINDS:
            raise ValueError(f"unknown activity kind {kind!r}")
    rows = []
    for entry in map(_clean, entries):
        if entry["kind"] in APART_KINDS:
            if run.activity_apart >= APART_CAP:
                continue
            run.activity_apart += 1
        elif run.activity_agent > CAP:  # cut already
            continue
        else:
            run.activity_agent += 1
            if run.activity_agent > CAP:
                entry = {"kind": ActivityKind.TRUNCATED, "ms": None, "tokens": None,
                         "text": f"The activity log keeps {CAP} of the agent's entries; "
                                 "later ones are dropped.", "data": None, "at": entry["at"]}
        run.activity_last += 1
        rows.append(sql.new(Activity, run_id=run.pk, seq=run.activity_last,
                            generation=generation, **entry))
    return rows


def published(run_id, rows: list[Activity]) -> None:
    """Push ``rows`` to the run's sockets once the transaction that writes them commits."""
    transaction.on_commit(partial(outside.changes.publish_activity, run_id=run_id,
                                  entries=[activity_data(row) for row in rows]), robust=True)


TAKEN = {"pause": "pause requested", "cancel": "cancel delivered",
         "message": "message delivered", "wake": "wake delivered"}


def control_taken(*, run_id, generation: int, command: str, actor: str | None,
                  source: str | None) -> None:
    """Note a live command the run's attempt took (a pause, a message, a wake, a live
    cancel): who sent it, from where."""
    activity_record(run_id=run_id, generation=generation, entries=[{
        "kind": ActivityKind.CONTROL, "text": TAKEN.get(command, f"{command} delivered"),
        "data": {"action": command, "actor": actor, "source": source}}])


def is_pause(entry: Activity) -> bool:
    """Whether a control entry is a pause (the entries before deliveries were noted are
    all pauses, and some name no action)."""
    return (entry.data or {}).get("action", "pause") == "pause"


def run_activity(*, run_id, after: int = 0, last: int | None = None,
                 limit: int | None = None) -> list[Activity]:
    """The run's entries after ``after``, oldest first (the first ``limit`` of them);
    ``last``: only the newest ones."""
    entries = Activity.objects.filter(run_id=run_id, seq__gt=after)
    if last is None:
        return list(entries.order_by("seq")[:limit])
    return list(entries.order_by("-seq")[:last])[::-1]


def activity_count(*, run_id) -> int:
    return Activity.objects.filter(run_id=run_id).aggregate(last=Max("seq"))["last"] or 0


SHOWN = 200  # entries a run's page shows at first; the rest are one link away


def activity_facts(*, run_id) -> dict:
    """What a run's page shows from its activity beyond the log itself: the last progress
    the agent gave, the error that failed an attempt (with its traceback), and the live
    requests the attempts took (pauses), oldest first."""
    entries = Activity.objects.filter(run_id=run_id)
    controls = entries.filter(kind=ActivityKind.CONTROL).order_by("seq")
    return {
        "progress": entries.filter(kind=ActivityKind.PROGRESS).order_by("-seq").first(),
        "failure": entries.filter(kind=ActivityKind.ERROR).order_by("-seq").first(),
        "live_requests": [entry for entry in controls if is_pause(entry)],
        "activity_total": activity_count(run_id=run_id),
    }
