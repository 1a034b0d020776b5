"""The web side of the wire: hand queued runs to workers, send live commands to them.

This is the domain's ``workers`` port (``runs.domain.ports``). Nothing here talks to the
broker on the thread that calls it: the broker is reached by the courier, a few threads of
this process with their own connections, and a caller waits for an answer no longer than
its deadline (SPEC §8). A request thread never holds a database connection while it waits.
A failure here loses nothing: the sweeper re-sends lost dispatches, and a pending intent
reaches its attempt on the next lease renewal or is applied when the lease expires.
"""

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from celery import current_app
from django.conf import settings
from django.db import connection
from django.utils import timezone
from prometheus_client import Counter

from runs.domain.errors import NotActive

log = logging.getLogger(__name__)

EXECUTE = "runs.execute"  # the worker side's task (runs.tasks.execute), sent by name
BULK = "runs.bulk"  # the task that carries out a bulk job (runs.tasks.bulk)
DELIVER = "awaken_deliver"  # the worker side's remote-control command (runs.wire.worker_side)

NOT_ACTIVE = Counter("awaken_not_active", "Live commands this process sent that were answered "
                     "NotActive (no live attempt, or its owner did not take it).", ["command"])
DROPPED = Counter("awaken_courier_dropped", "Broker calls this process did not make because "
                  "its courier was full (a dispatch or a live signal; both are recovered).")


class Courier:
    """The threads of this process that talk to the broker for everyone else.

    At most ``threads`` calls are made at once and ``backlog`` wait; past that a call is
    refused at once rather than queued without end. Each thread keeps a broker connection
    of its own for live commands, so no caller waits on a shared pool either.
    """

    def __init__(self, *, threads: int, backlog: int):
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="awaken-courier")
        self._slots = threading.BoundedSemaphore(threads + backlog)
        self._local = threading.local()

    def post(self, fn, /, **kwargs) -> Future | None:
        """Run ``fn(**kwargs)`` on a courier thread; None if the courier is full."""
        if not self._slots.acquire(blocking=False):
            DROPPED.inc()
            return None
        future = self._pool.submit(fn, **kwargs)
        future.add_done_callback(lambda _: self._slots.release())
        return future

    def call(self, fn, /, *, timeout: float, **kwargs):
        """``fn(**kwargs)`` on a courier thread, waited for at most ``timeout`` seconds by a
        caller that holds no database connection meanwhile. Raises TimeoutError when it
        takes longer (or the courier is full); the call itself goes on, with a deadline of
        its own."""
        future = self.post(fn, **kwargs)
        if future is None:
            raise TimeoutError("the courier is full")
        release_database()
        try:
            return future.result(timeout)
        except FutureTimeout:
            raise TimeoutError(f"no answer from the broker within {timeout:g} s") from None

    def broker(self):
        """This courier thread's own broker connection, made (and re-made) on demand."""
        conn = getattr(self._local, "connection", None)
        if conn is None:
            conn = current_app.connection_for_write()
            conn.ensure_connection(max_retries=1, timeout=settings.AWAKEN_BROKER_TIMEOUT)
            self._local.connection = conn
        return conn

    def forget_broker(self) -> None:
        conn = getattr(self._local, "connection", None)
        self._local.connection = None
        if conn is not None:
            try:
                conn.release()
            except Exception:
                pass


_courier: Courier | None = None
_courier_lock = threading.Lock()


def courier() -> Courier:
    global _courier
    with _courier_lock:
        if _courier is None:
            _courier = Courier(threads=settings.AWAKEN_COURIER_THREADS,
                               backlog=settings.AWAKEN_COURIER_BACKLOG)
        return _courier


def release_database() -> None:
    """Give this thread's database connection back to the pool before a wait on the
    network (PostgreSQL's pool; the next query takes one again). Not inside a transaction,
    and not on SQLite, whose connections are per thread and cheap to keep."""
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        connection.close()


# --- dispatch ---------------------------------------------------------------------------------


def runs_queued(*, runs) -> None:
    """Runs became queued: hand each ``(run_id, start_after)`` to a worker, from the courier
    (the caller does not wait). A dispatch the courier has no room for is sent again by the
    sweeper, as a lost message would be."""
    if courier().post(send_runs, runs=list(runs)) is None:
        log.warning("courier full: %d queued run(s) left for the sweeper", len(runs))


def send_runs(*, runs) -> None:
    """Send the task messages of ``runs`` over one broker connection. Runs due now go in
    messages of up to ``AWAKEN_DISPATCH_CHUNK`` runs (the worker claims each on its own); a
    run that starts later goes alone, at its time."""
    now = timezone.now()
    due = [str(run_id) for run_id, start_after in runs if not start_after or start_after <= now]
    later = [(str(run_id), start_after) for run_id, start_after in runs
             if start_after and start_after > now]
    size = settings.AWAKEN_DISPATCH_CHUNK
    app = current_app
    try:
        with app.producer_or_acquire() as producer:
            for first in range(0, len(due), size):
                app.send_task(EXECUTE, args=[due[first:first + size]], producer=producer)
            for run_id, start_after in later:
                app.send_task(EXECUTE, args=[[run_id]], eta=start_after, producer=producer)
    except Exception:
        log.warning("dispatch of %d run(s) failed; the sweeper sends them again", len(runs),
                    exc_info=True)


def bulk_queued(*, job_id) -> None:
    """Hand a bulk job to a worker, from the courier. A message that is not sent is sent
    again by the sweeper, which watches the jobs that make no progress."""
    if courier().post(send_bulk, job_id=str(job_id)) is None:
        log.warning("courier full: bulk job %s left for the sweeper", job_id)


def send_bulk(*, job_id: str) -> None:
    try:
        current_app.send_task(BULK, args=[job_id])
    except Exception:
        log.warning("bulk job %s not sent; the sweeper sends it again", job_id, exc_info=True)


# --- live commands ----------------------------------------------------------------------------


def owner_node(owner: str) -> str:
    """The Celery node name in an attempt owner ("node:pid")."""
    return owner.rsplit(":", 1)[0]


def deliver(*, run_id, generation: int, owner: str | None, command: str,
            actor: str | None = None, source: str | None = None, message=None) -> None:
    """Deliver a live command to attempt ``generation`` held by ``owner`` (the run's claim as
    committed), waiting at most ``AWAKEN_DELIVERY_TIMEOUT`` for its answer.

    Raises NotActive when nothing holds the claim, its owner does not take the command
    (another generation, a finished attempt, a worker that is gone) or no answer comes in
    time. Nothing is retried.
    """
    if owner is not None:
        timeout = settings.AWAKEN_DELIVERY_TIMEOUT
        try:
            if courier().call(_ask_owner, timeout=timeout + 0.25, node=owner_node(owner),
                              arguments={"run_id": str(run_id), "generation": generation,
                                         "command": command, "actor": actor,
                                         "source": source, "message": message}):
                return
        except TimeoutError:
            log.info("run %s: no answer to %s in time", run_id, command)
    NOT_ACTIVE.labels(command).inc()
    if owner is None:
        raise NotActive(f"Run {run_id} has no live attempt.")
    raise NotActive(f"The attempt of run {run_id} did not take the {command}.")


def signal(*, run_id, generation: int, owner: str, command: str, actor: str | None = None,
           source: str | None = None) -> None:
    """Send a live command and wait for nobody: the durable path stands behind it. No answer
    is asked for, so the worker sends none."""
    courier().post(_ask_owner, node=owner_node(owner), reply=False,
                   arguments={"run_id": str(run_id), "generation": generation,
                              "command": command, "actor": actor, "source": source})


def _ask_owner(*, node: str, arguments: dict, reply: bool = True) -> bool:
    """On a courier thread: the remote-control command to one worker node, and its answer
    (whether it was delivered) if ``reply``."""
    carrier = courier()
    try:
        replies = current_app.control.broadcast(
            DELIVER, arguments=arguments, destination=[node], reply=reply, limit=1,
            timeout=settings.AWAKEN_DELIVERY_TIMEOUT, connection=carrier.broker()) or []
    except Exception:
        carrier.forget_broker()
        log.warning("live %s for run %s not sent", arguments["command"], arguments["run_id"],
                    exc_info=True)
        return False
    return any(answer.get("delivered") for reply in replies for answer in reply.values())


# --- health -----------------------------------------------------------------------------------


def broker_and_workers() -> tuple[str, int]:
    """On a courier thread: whether the broker answers, and how many workers answer a
    ping, each within ``AWAKEN_BROKER_TIMEOUT``."""
    carrier = courier()
    try:
        carrier.broker().ensure_connection(max_retries=1,
                                           timeout=settings.AWAKEN_BROKER_TIMEOUT)
    except Exception:
        carrier.forget_broker()
        return "down", 0
    try:
        replies = current_app.control.ping(timeout=settings.AWAKEN_BROKER_TIMEOUT,
                                           connection=carrier.broker()) or []
    except Exception:
        carrier.forget_broker()
        return "down", 0
    return "ok", len(replies)
