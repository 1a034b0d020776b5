"""A run's activity log: steps, model calls, tool calls and the agent's own lines.

It is a record of what happened, not state: no transition reads it. The worker writes a
few entries at a time as the attempt goes (``runs.runtime``), an operator's live request
(a pause) is written when the attempt takes it, and each entry is pushed to the run's
sockets after commit. A run keeps at most ``CAP`` of the agent's entries (steps, calls, lines,
progress): the next one is a ``truncated`` note, and later ones are dropped, so a chatty
agent cannot fill the table. The entries that are not the agent's to spend, the error that
failed an attempt and the live requests the attempts took (one per operator pause), are
counted apart, up to ``APART_CAP``: a run at its cap still shows why it failed, and pauses
never use up the agent's room.
"""

import json
from functools import partial

from django.db import transaction
from django.db.models import Count, Max, Q
from django.utils import timezone

from runs.domain import outside
from runs.domain.representation import activity_data
from runs.domain.text import clipped
from runs.models import Activity, ActivityKind, Run

CAP = 2000  # the agent's entries per run
APART_CAP = 500  # error and control entries per run, besides
AGENT_KINDS = (ActivityKind.STEP, ActivityKind.MODEL, ActivityKind.TOOL, ActivityKind.LOG,
               ActivityKind.PROGRESS)
APART_KINDS = (ActivityKind.ERROR, ActivityKind.CONTROL)
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
    """Append ``entries`` (dicts of kind, text, ms, tokens, data, at) to the run's log and
    push them after commit. Returns the rows written (fewer once the run is at its cap)."""
    if not entries:
        return []
    for kind in {entry["kind"] for entry in entries}:
        if kind not in ActivityKind.values:
            raise ValueError(f"unknown activity kind {kind!r}")
    cleaned = [_clean(entry) for entry in entries]
    with transaction.atomic():
        # The run's row lock numbers its entries one writer at a time (the worker, and the
        # web process noting a pause): each reads the last number after the other's commit.
        # Held for one small insert; a transition holds it as briefly.
        if not Run.objects.select_for_update().filter(pk=run_id).values_list("pk").exists():
            return []
        rows = _append(run_id, generation, cleaned)
        if rows:
            transaction.on_commit(partial(
                outside.changes.publish_activity, run_id=run_id,
                entries=[activity_data(row) for row in rows]), robust=True)
        return rows


def _append(run_id, generation: int, entries: list[dict]) -> list[Activity]:
    """Number and insert what the caps leave of ``entries``: the agent's up to ``CAP``, then
    one ``truncated`` note; errors and controls up to ``APART_CAP``, whatever the agent
    wrote."""
    of_run = Activity.objects.filter(run_id=run_id)
    last = of_run.aggregate(last=Max("seq"))["last"] or 0  # the index on (run, seq)
    if last + len(entries) <= min(CAP, APART_CAP):
        # No cap can be reached: each count is at most the last number. The common case,
        # which reads one index entry instead of counting the run's whole log.
        agent = apart = 0
        truncated = False
    else:
        counts = of_run.aggregate(
            agent=Count("pk", filter=Q(kind__in=AGENT_KINDS)),
            apart=Count("pk", filter=Q(kind__in=APART_KINDS)),
            truncated=Count("pk", filter=Q(kind=ActivityKind.TRUNCATED)))
        agent, apart, truncated = counts["agent"], counts["apart"], bool(counts["truncated"])
    rows = []
    for entry in entries:
        if entry["kind"] in APART_KINDS:
            if apart >= APART_CAP:
                continue
            apart += 1
        elif agent < CAP:
            agent += 1
        elif not truncated:
            truncated = True
            entry = {"kind": ActivityKind.TRUNCATED, "ms": None, "tokens": None,
                     "text": f"The activity log keeps {CAP} of the agent's entries; later "
                             "ones are dropped.", "data": None, "at": entry["at"]}
        else:
            continue
        rows.append(Activity(run_id=run_id, seq=last + len(rows) + 1, generation=generation,
                             **entry))
    return Activity.objects.bulk_create(rows)


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
