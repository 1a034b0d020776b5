"""The one JSON representation of a run and of an event (the shapes of API.md).

The REST API, the socket snapshots and pushes, and the waiting control calls all send what
these functions write. The API's serializers declare the same shapes for validation and the
OpenAPI document; a test holds the two to the same output. Plain functions, because a run
is represented on every transition of every run (DRF rebuilt each declared field per
object, which cost more than the database work).

Sockets get a run whole unless it is too large (``AWAKEN_PUSH_RUN_BYTES``): then without its
input, output and ticket prompt, and with ``"truncated": true``. A snapshot is kept under
``SNAPSHOT_BYTES`` by truncating its largest runs first, so one large run never fails it.
"""

import json

from django.conf import settings
from django.utils import timezone

from runs.models import Activity, BulkJob, Event, Run, WorkerProcess


def when(value, zone=None) -> str | None:
    """A datetime in ISO 8601 as DRF writes it (current time zone, UTC as ``Z``). A caller
    that writes several may pass the current time zone, read once, as ``zone``."""
    if value is None:
        return None
    text = timezone.localtime(value, zone).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def ticket_data(ticket, zone=None) -> dict | None:
    if ticket is None:
        return None
    return {"id": str(ticket.id), "reason": ticket.reason, "prompt": ticket.prompt,
            "schema": ticket.schema, "action": action_data(ticket.action),
            "created_at": when(ticket.created_at, zone)}


def action_data(action: dict | None) -> dict | None:
    """The one tool call an approval ticket is bound to (``runs.domain.approvals``)."""
    if action is None:
        return None
    return {"tool": action["tool"], "arguments": action["arguments"],
            "digest": action["digest"], "rationale": action.get("rationale")}


def control_data(intent, zone=None) -> dict | None:
    if intent is None:
        return None
    return {"action": intent.action, "reason": intent.reason, "stop_code": intent.stop_code,
            "requested_by": intent.requested_by, "source": intent.source,
            "requested_at": when(intent.requested_at, zone),
            "delivered_at": when(intent.delivered_at, zone),
            "applied_at": when(intent.applied_at, zone),
            "caused_by": None if intent.caused_by_id is None else str(intent.caused_by_id),
            "receipt": intent.receipt}


# Left out of a run loaded without them (a large run in a list page).
PAYLOAD = frozenset({"input", "output"})


def run_url(run_id) -> str:
    """The path of a run's page (the route ``runs-page``)."""
    return f"/runs/{run_id}/"


def run_data(run: Run) -> dict:
    """The representation of ``run``. A run loaded without its input and output (see
    ``selectors.run_list``) is written without them and with ``"truncated": true``."""
    truncated = not PAYLOAD.isdisjoint(run.get_deferred_fields())
    zone = timezone.get_current_timezone()
    data = {
        "id": str(run.id), "url": run_url(run.id), "agent": run.agent,
        "input": None if truncated else run.input, "thread_id": run.thread_id,
        "parent_id": None if run.parent_id is None else str(run.parent_id),
        "rerun_of": None if run.rerun_of_id is None else str(run.rerun_of_id),
        "state": run.state, "end_cause": run.end_cause, "stop_code": run.stop_code,
        "stop_reason": run.stop_reason, "error": run.error,
        "output": None if truncated else run.output,
        "generation": run.generation, "owner": run.owner,
        "ticket": ticket_data(run.ticket if run.ticket_id is not None else None, zone),
        "control": control_data(run.control if run.control_id is not None else None,
                                zone),
        "actions": list(run.allowed_actions),
        "budget": {"max_steps": run.max_steps, "max_seconds": run.max_seconds,
                   "max_tokens": run.max_tokens, "max_cost_usd": run.max_cost_usd,
                   "max_repeats": run.max_repeats, "on_exhausted": run.on_exhausted},
        "usage": {"steps": run.steps, "tokens": run.tokens, "seconds": run.seconds_used,
                  "cost_usd": run.cost_usd},
        "duration": run.duration,
        "version": run.version, "start_after": when(run.start_after, zone),
        "created_at": when(run.created_at, zone), "started_at": when(run.started_at, zone),
        "ended_at": when(run.ended_at, zone), "updated_at": when(run.updated_at, zone),
    }
    if truncated:
        del data["input"], data["output"]
        data["truncated"] = True
    return data


def event_data(event: Event) -> dict:
    """The representation of ``event``."""
    return {"seq": event.seq, "run_id": str(event.run_id), "version": event.version,
            "kind": event.kind, "state": event.state, "end_cause": event.end_cause,
            "generation": event.generation, "actor": event.actor, "source": event.source,
            "data": event.data, "at": when(event.at)}


# Daphne refuses to send a websocket message over 1 MiB; a snapshot stays well under it.
SNAPSHOT_BYTES = 512 * 1024


def truncated(data: dict) -> dict:
    """A run's representation without the values a client or an agent sized: what is
    pushed of a run too large to push whole."""
    cut = {key: value for key, value in data.items() if key not in ("input", "output")}
    if cut["ticket"] is not None:
        cut["ticket"] = {key: value for key, value in cut["ticket"].items() if key != "prompt"}
        if cut["ticket"].get("action") is not None:
            cut["ticket"]["action"] = {key: value for key, value
                                       in cut["ticket"]["action"].items()
                                       if key != "arguments"}
    cut["truncated"] = True
    return cut


def pushed(data: dict) -> str:
    """A run's representation encoded for a socket: whole, or truncated if larger than
    ``AWAKEN_PUSH_RUN_BYTES``. JSON escapes every non-ASCII character, so a text's length is
    its size in bytes."""
    text = json.dumps(data)
    return text if len(text) <= settings.AWAKEN_PUSH_RUN_BYTES else json.dumps(truncated(data))


def bulk_data(job: BulkJob) -> dict:
    """The representation of a bulk job: what it asks, of which runs, and how far it got."""
    return {"id": str(job.id), "action": job.action, "reason": job.reason,
            "filter": job.filter, "state": job.state, "total": job.total, "done": job.done,
            "applied": job.applied, "unchanged": job.unchanged, "refused": job.refused,
            "requested_by": job.requested_by, "source": job.source,
            "aborted_by": job.aborted_by, "version": job.version,
            "created_at": when(job.created_at), "started_at": when(job.started_at),
            "finished_at": when(job.finished_at)}


def bulk_text(job: BulkJob) -> str:
    """The ``bulk.changed`` socket message for a bulk job's progress, encoded once."""
    return json.dumps({"type": "bulk.changed", "job": bulk_data(job)})


def change_text(*, run: Run, event: Event) -> str:
    """The ``run.changed`` socket message for one committed event, encoded once."""
    return (f'{{"type": "run.changed", "seq": {event.seq}, '
            f'"event": {json.dumps(event_data(event))}, "run": {pushed(run_data(run))}}}')


def snapshot_text(*, seq: int, runs: list[Run]) -> str:
    """The ``snapshot`` socket message: the newest seq, then the runs, within
    ``SNAPSHOT_BYTES``: the largest runs are truncated first, and if every run is and it is
    still too large, the oldest runs are left out (the page loads them)."""
    datas = [run_data(run) for run in runs]
    texts = [pushed(data) for data in datas]
    head = f'{{"type": "snapshot", "seq": {seq}, "runs": ['
    room = SNAPSHOT_BYTES - len(head) - 2
    size = sum(len(text) for text in texts) + 2 * max(len(texts) - 1, 0)  # with ", "
    for i in sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True):
        if size <= room:
            break
        cut = json.dumps(truncated(datas[i]))
        size, texts[i] = size - len(texts[i]) + len(cut), cut
    while texts and size > room:
        size -= len(texts.pop()) + (2 if texts else 0)
    return head + ", ".join(texts) + "]}"


def activity_data(entry: Activity) -> dict:
    """An entry of a run's activity log, as its page and the run's sockets get it. A
    failure's traceback (server paths, the code's own lines) is left out: only staff see
    it, on the run's page."""
    data = entry.data
    if isinstance(data, dict) and "traceback" in data:
        data = {key: value for key, value in data.items() if key != "traceback"}
    return {"seq": entry.seq, "generation": entry.generation, "kind": entry.kind,
            "text": entry.text, "ms": entry.ms, "tokens": entry.tokens, "data": data,
            "at": when(entry.at)}


def activity_text(*, run_id, entries: list[dict]) -> str:
    """A ``run.activity`` push: new entries of one run's activity log (not state: no seq of
    the change stream; each entry has the run's own ``seq``)."""
    return json.dumps({"type": "run.activity", "run_id": str(run_id), "entries": entries})


def worker_data(worker: WorkerProcess) -> dict:
    """A worker process as ``GET /api/workers/`` gives it (``selectors.workers`` marks
    ``alive`` and its live ``attempts``)."""
    return {"name": worker.owner, "alive": worker.alive, "draining": worker.draining,
            "capacity": worker.capacity, "live_attempts": len(worker.attempts),
            "abandoned_tools": worker.abandoned_tools, "last_seen": when(worker.reported_at),
            "drained_by": worker.drained_by or None, "drained_at": when(worker.drained_at),
            "runs": [str(attempt.run_id) for attempt in worker.attempts]}
