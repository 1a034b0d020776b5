"""What happens after commit when a run is queued or a control intent is recorded.

The execution layer (``runs.tasks``, ``runs.control``) does the work; the services only
name the moment, so they never import Celery.
"""


def run_queued(*, run_id, start_after=None) -> None:
    """A run became queued: hand it to a worker."""


def intent_recorded(*, run_id, intent_id) -> None:
    """A cancel or stop of a running run was recorded: tell its attempt."""
