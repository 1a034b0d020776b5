"""What this process publishes to the change stream: the domain's ``changes`` port.

Every committed transition is published once, after commit, encoded once
(``runs.domain.representation``): the run as committed with its event, a bulk job's
progress, new activity entries of a run. Live output of a model call goes the same way
without being a committed change.
"""

from runs.changes.stream import stream
from runs.domain.representation import activity_text, bulk_text, change_text


def publish_output(*, run_id, text: str) -> None:
    """Publish a live output message (``runs.runtime.output``) to the sockets of one run.

    It is not a committed change: no seq, no run, nothing stored; only the sockets that
    follow that one run get it, never the run list or a waiting call.
    """
    stream.publish([{"type": "run.output", "run_id": str(run_id), "text": text}])


def publish_activity(*, run_id, entries: list[dict]) -> None:
    """Publish new entries of a run's activity log to the sockets of that run, as live output
    goes: only the sockets that follow the one run get them."""
    publish_output(run_id=run_id, text=activity_text(run_id=run_id, entries=entries))


def publish_changes(*, changes) -> None:
    """Publish committed ``(run, event)`` pairs, in the order given."""
    # ``run_id`` routes a change to the sockets of its run and lets a process skip decoding
    # a change nobody there waits for.
    stream.publish([{"type": "run.changed", "run_id": str(run.id),
                     "text": change_text(run=run, event=event)} for run, event in changes])


def publish_bulk(*, job) -> None:
    """Publish a bulk job's committed state and progress to the sockets of the run list."""
    stream.publish([{"type": "bulk.changed", "text": bulk_text(job)}])
