"""Live commands arrive in a worker here, as a Celery remote-control command, and are applied.

It runs in the worker's main process, where the executor and its active-attempt registry
live. A command reaches an attempt only if the attempt is registered here under the
generation named, and the run's claim, as committed, is still this process's for that
generation (an attempt the sweeper re-queued meanwhile is not live, whatever the registry
says). Anything else is NotActive. A command carries its deadline: one applied after it
would contradict the NotActive its sender has answered meanwhile, so it is dropped.
"""

import logging
import time

from celery.concurrency import get_implementation
from celery.signals import worker_init
from celery.worker.control import control_command
from django.conf import settings
from django.db import close_old_connections

from runs.domain import selectors
from runs.runtime.executor import current_executor, get_executor

log = logging.getLogger(__name__)

# The node name this process's worker answers to: the destination of live commands.
node_name: str | None = None

# How long a command for an attempt whose claim just committed here waits for the attempt
# to be registered (the claim commits a moment before the registration).
REGISTRATION_WAIT = 0.5


@worker_init.connect
def remember_node_name(sender, **kwargs):
    global node_name
    node_name = sender.hostname


@worker_init.connect
def refuse_a_pool_too_small(sender, **kwargs):
    """A worker whose threads may hold more database connections at once than its pool
    opens would wait on itself: each database thread of the executor keeps its
    connection, so with too few the claims of the task threads wait for a connection that
    never comes back, and nothing runs. It does not start, and says why."""
    short = pool_shortfall(pool=settings.DATABASES["default"].get("OPTIONS", {}).get("pool"),
                           concurrency=sender.concurrency,
                           db_threads=settings.AWAKEN_DB_THREADS)
    if short:
        log.critical(short)
        raise SystemExit(short)  # a handler's Exception would be logged and passed over


@worker_init.connect
def start_the_executor(sender, **kwargs):
    """A worker of a threads pool (the Procfile's, the embedded site's) starts its executor
    with itself rather than at its first run: what is slow to make the first time in the
    process is made before work arrives (``runs.runtime.executor``), and the workers page
    shows the process from its start. (A prefork pool's tasks would run in its children.)"""
    if get_implementation(sender.pool_cls) is get_implementation("threads"):
        get_executor(node=node_name)


def pool_shortfall(*, pool, concurrency: int, db_threads: int) -> str | None:
    """Why a connection ``pool`` (its options; None: none, as on SQLite) is too small for a
    worker of ``concurrency`` task threads and ``db_threads`` database threads; None if it
    is not."""
    needed = concurrency + db_threads
    if not isinstance(pool, dict) or pool.get("max_size", needed) >= needed:
        return None
    return (f"DB_POOL_MAX is {pool['max_size']}, but this worker's {concurrency} task "
            f"threads and {db_threads} database threads (AWAKEN_DB_THREADS) may hold "
            f"{needed} connections at once: set DB_POOL_MAX to {needed} or more, or lower "
            "--concurrency or AWAKEN_DB_THREADS.")


@control_command(
    args=[("run_id", str), ("generation", int), ("command", str), ("actor", str),
          ("source", str), ("deadline", float)],
    signature="<run_id> <generation> <cancel|pause|wake|message> [actor] [source] "
              "[deadline] [message]",
)
def awaken_command(state, run_id, generation, command, actor=None, source=None,
                   deadline=None, message=None):
    """The command sent by ``runs.workers.dispatch``; the answer says whether it was
    applied (the web side waits for it only when it asked for one). ``deadline``: the
    time (seconds since the epoch) after which it is dropped."""
    return {"applied": apply_command(run_id, generation, command, deadline=deadline,
                                     actor=actor, source=source, message=message),
            "generation": generation}


def apply_command(run_id, generation: int, command: str, *, deadline: float | None = None,
                  **details) -> bool:
    """Apply a live command to attempt ``generation`` of the run if it lives here, still
    holds the claim and ``deadline`` has not passed; whether it was applied."""
    if late(deadline, run_id, command):
        return False
    executor = current_executor()
    if executor is None:
        return False
    try:
        holds = selectors.claim_holds(run_id=run_id, generation=generation,
                                      owner=executor.owner)
    except Exception:
        close_old_connections()  # a broken connection is not kept for the next command
        raise
    if not holds:
        return False
    if executor.registry.get(run_id, generation) is None:
        executor.registry.wait_for(run_id, generation, REGISTRATION_WAIT)
    if late(deadline, run_id, command):
        return False
    return executor.registry.apply(run_id, generation, command, **details) is not None


def late(deadline: float | None, run_id, command: str) -> bool:
    """Whether a command's deadline has passed (it is then dropped, and logged)."""
    if deadline is None or time.time() <= deadline:
        return False
    log.info("live %s for run %s dropped: %.1f s past its deadline", command, run_id,
             time.time() - deadline)
    return True
