"""Answer a control request with committed state, waiting up to ``wait`` seconds for it.

The wait is woken by the change stream's push of the run's next committed change, never by
polling; the push carries the committed run, so waking costs no query, and the request
holds no database connection while it waits. The view watches the run before its request
is committed (``watching``): every change committed after it is pushed to the watch, so the
run as the request committed it is all the wait needs to start from, with no read. A cancel
or stop with nothing to wait for (``wait=0``, or a run it ended itself, as the cancel of a
queued run does, or found ended) answers with that run, with no read either. When the
web shuts down its watches are ended (``runs.sockets.shutdown``): a wait then answers at once
with the run as committed, as one that ran out does (202 while the request is pending).
"""

import time
from contextlib import contextmanager

from runs.changes.stream import stream
from runs.domain import selectors
from runs.domain.representation import run_data
from runs.models import Run, RunState
from runs.workers.broker import release_database

SUBSCRIBE_SECONDS = 2.0  # how long a wait waits for the stream to subscribe


@contextmanager
def watching(run_id):
    """Watch the run's pushes from here on: around the request that changes it. It does
    not wait for the stream to subscribe: the request is not held up (a durable intent is
    written first), and a wait that began unsubscribed reads the run once subscribed."""
    with stream.watch(run_id, timeout=0) as watch:
        yield watch


def wait_for_end(run: Run, wait: float, watch) -> dict:
    """The answer to a cancel or stop, whose transaction committed ``run``."""
    return wait_until(run, wait, lambda state: state == RunState.ENDED, watch, own=True)


def wait_until_not_running(run, wait: float, watch) -> dict:
    """The answer to a pause, which commits nothing: ``run`` was read before its live
    command, and the attempt may have paused or ended since."""
    return wait_until(run, wait, lambda state: state != RunState.RUNNING, watch, own=False)


def wait_until(run: Run, wait: float, done, watch, *, own: bool) -> dict:
    """The run (as the API shows it) once ``done(state)`` holds, or as committed at the end.

    ``run`` is the run as committed when ``watch`` began or later: a later change is pushed
    to the watch. With nothing to wait for (no time, ``done`` already, or the process
    shutting down), the answer is ``run`` itself if the caller's own transaction committed
    it (``own``), else the run read. Otherwise the run is read only when the wait ends
    without a push that is done, or when the stream was not subscribed yet."""
    deadline = time.monotonic() + wait
    if wait <= 0 or watch.ended or done(run.state):  # ended: the process shuts down
        return run_data(run) if own else committed(run.pk)
    version = run.version
    if not watch.live:  # not subscribed when the request began: a change may be unpushed
        if not stream.listening(SUBSCRIBE_SECONDS):
            return committed(run.pk)  # no push will come: the state committed so far
        current = committed(run.pk)
        if done(current["state"]):
            return current
        version = current["version"]
    release_database()  # the wait is for a push, not for the database
    while True:
        left = deadline - time.monotonic()
        pushed = watch.next(left) if left > 0 else None
        if pushed is None:
            return committed(run.pk)
        if pushed["version"] > version:
            if done(pushed["state"]):
                return pushed
            version = pushed["version"]


def committed(run_id) -> dict:
    return run_data(selectors.run_get(run_id))
