"""Answer a control request with committed state, waiting up to ``wait`` seconds for it.

The wait is woken by the broadcast of the run's next committed change, never by polling.
"""

import time

from runs import selectors
from runs.broadcast import watchers
from runs.models import RunState


def wait_for_end(run_id, wait: float):
    return wait_until(run_id, wait, lambda run: run.state == RunState.ENDED)


def wait_until_not_running(run_id, wait: float):
    return wait_until(run_id, wait, lambda run: run.state != RunState.RUNNING)


def wait_until(run_id, wait: float, done):
    """The run as committed once ``done(run)`` holds, or as committed when time is up."""
    run = selectors.run_get(run_id)
    if wait <= 0 or done(run):
        return run
    deadline = time.monotonic() + wait
    with watchers.watch(run_id) as changed:
        run = selectors.run_get(run_id)  # re-read after subscribing: nothing slips between
        while not done(run):
            left = deadline - time.monotonic()
            if left <= 0 or not changed.wait(left):
                break
            changed.clear()
            run = selectors.run_get(run_id)
    return run
