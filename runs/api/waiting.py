"""Answer a control request with committed state, waiting up to ``wait`` seconds for it.

The wait is woken by the change stream's push of the run's next committed change, never by
polling; the push carries the committed run, so waking costs no query, and the request
holds no database connection while it waits.
"""

import time

from runs.changes import stream
from runs.domain import selectors
from runs.domain.representation import run_data
from runs.models import Run, RunState
from runs.wire.web_side import release_database


def wait_for_end(run, wait: float) -> dict:
    return wait_until(run, wait, lambda state: state == RunState.ENDED)


def wait_until_not_running(run, wait: float) -> dict:
    return wait_until(run, wait, lambda state: state != RunState.RUNNING)


def wait_until(run: Run, wait: float, done) -> dict:
    """The run (as the API shows it) once ``done(state)`` holds, or as committed at the end.

    ``run`` is the run as the caller's transaction committed it: if it was not done then,
    the wait subscribes first and reads it once subscribed (no read beforehand)."""
    run_id = run.pk
    deadline = time.monotonic() + wait
    if wait <= 0 or done(run.state):
        run = committed(run_id)
        if wait <= 0 or done(run["state"]):
            return run
    with stream.watch(run_id) as watch:
        run = committed(run_id)  # read again once subscribed: nothing slips in between
        release_database()  # the wait is for a push, not for the database
        while watch.live and not done(run["state"]):
            left = deadline - time.monotonic()
            pushed = watch.next(left) if left > 0 else None
            if pushed is None:
                break
            if pushed["version"] > run["version"]:
                run = pushed
    return run


def committed(run_id) -> dict:
    return run_data(selectors.run_get(run_id))
