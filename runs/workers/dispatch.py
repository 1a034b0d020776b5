"""What the web side sends to the workers: the domain's ``workers`` port.

Queued runs and bulk jobs go as Celery task messages; a live command goes as a Celery
remote-control command to the one worker node named on the run's claim, where
``runs.workers.commands`` applies it. Every broker call is made on a broker thread
(``runs.workers.broker``), never on the caller's. A failure here loses nothing: the sweeper
re-sends lost dispatches, and a pending intent reaches its attempt on the next lease
renewal or is applied when the lease expires.
"""

import logging
import threading
import time

from celery import current_app
from django.conf import settings
from django.utils import timezone
from prometheus_client import Counter

from runs.domain.errors import Busy, NotActive
from runs.workers.broker import BrokerFull, broker_threads
from runs.workers.kombu import forget_late_answers

log = logging.getLogger(__name__)

EXECUTE = "runs.execute"  # the worker side's task (runs.tasks.execute), sent by name
BULK = "runs.bulk"  # the task that carries out a bulk job (runs.tasks.bulk)
COMMAND = "awaken_command"  # the remote-control command of runs.workers.commands

# A live command's deadline is this long before its sender stops waiting for the answer,
# so that an answer given at the deadline still reaches it: what is not taken by then is
# dropped by the worker, and a NotActive answer is final (SPEC §4). The deadline is on the
# wall clock, shared by the web and the workers (NTP keeps their clocks well within this).
ANSWER_MARGIN = 0.25

NOT_ACTIVE = Counter("awaken_not_active", "Live commands this process sent that were answered "
                     "NotActive (no live attempt, or its owner did not take it).", ["command"])


# --- dispatch ---------------------------------------------------------------------------------


def runs_queued(*, runs) -> None:
    """Runs became queued: hand each ``(run_id, start_after)`` to a worker, from a broker
    thread (the caller does not wait). Runs queued while a send is being made go together
    in the next one (``Dispatches``)."""
    dispatches.add(list(runs))


class Dispatches:
    """The queued runs of this process on their way to the broker, one send at a time.

    A run queued while no send is under way, and not within ``AWAKEN_DISPATCH_LINGER`` of
    the last one, is sent at once, from a broker thread. Runs queued while a send is under
    way, or within the linger after it, wait for it (the broker thread sleeps out the
    linger) and then go together: the runs of concurrent requests share task messages,
    and so a worker's claim transaction, as a batch's do. A lone run waits for nothing,
    and a run of a burst at most the linger; a broker thread sleeps out the linger only for
    runs that wait, never after a send that left none. Runs that fill a message on their own
    (``AWAKEN_DISPATCH_CHUNK``, a batch) have nothing to share and go at once, on a broker
    thread of their own. Past ``LIMIT`` runs waiting (a broker that does not answer), or
    with no broker thread free, the runs are left to the sweeper, which sends queued runs
    again as it would lost messages.
    """

    LIMIT = 10_000

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: list = []
        self._sending = False
        self._next_send = 0.0  # time.monotonic() before which no send begins

    def add(self, runs: list) -> None:
        if len(runs) >= settings.AWAKEN_DISPATCH_CHUNK:
            posted(send_runs, f"{len(runs)} queued run(s)", runs=runs)
            return
        with self._lock:
            if len(self._pending) + len(runs) > self.LIMIT:
                log.warning("%d runs wait for the broker: %d queued run(s) left for the "
                            "sweeper", len(self._pending), len(runs))
                return
            self._pending.extend(runs)
            if self._sending:
                return
            self._sending = True
        if not posted(self._send_pending, lambda: f"{len(self._pending)} queued run(s)"):
            with self._lock:
                self._pending, self._sending = [], False

    def idle(self) -> bool:
        """Whether no run waits here and no send is under way."""
        with self._lock:
            return not self._sending and not self._pending

    def _send_pending(self) -> None:  # on a broker thread, with runs pending
        while True:
            if (wait := self._next_send - time.monotonic()) > 0:
                time.sleep(wait)  # the runs queued meanwhile go with these
            with self._lock:
                runs, self._pending = self._pending, []
            try:
                send_runs(runs=runs)
            except Exception:  # whatever it was, the runs queued next still go
                log.exception("dispatch of %d run(s) failed; the sweeper sends them again",
                              len(runs))
            self._next_send = time.monotonic() + settings.AWAKEN_DISPATCH_LINGER
            with self._lock:  # nothing pending: the thread is not held through the linger
                if not self._pending:
                    self._sending = False
                    return


dispatches = Dispatches()


def posted(fn, what, **kwargs) -> bool:
    """Whether ``fn(**kwargs)`` was handed to a broker thread; if not (all are busy), it
    says so: ``what`` (a text, or a function that says it then) is left for the sweeper."""
    if broker_threads().post(fn, **kwargs) is None:
        log.warning("broker threads full: %s left for the sweeper",
                    what() if callable(what) else what)
        return False
    return True


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
    """Hand a bulk job to a worker, from a broker thread. A message that is not sent is sent
    again by the sweeper, which watches the jobs that make no progress."""
    posted(send_bulk, f"bulk job {job_id}", job_id=str(job_id))


def send_bulk(*, job_id: str) -> None:
    try:
        current_app.send_task(BULK, args=[job_id])
    except Exception:
        log.warning("bulk job %s not sent; the sweeper sends it again", job_id, exc_info=True)


# --- live commands ----------------------------------------------------------------------------


def owner_node(owner: str) -> str:
    """The Celery node name in an attempt owner ("node:pid")."""
    return owner.rsplit(":", 1)[0]


def send_command_and_wait(*, run_id, generation: int, owner: str | None, command: str,
                          actor: str | None = None, source: str | None = None,
                          message=None) -> None:
    """Send a live command to attempt ``generation`` held by ``owner`` (the run's claim as
    committed), waiting at most ``AWAKEN_DELIVERY_TIMEOUT`` for its answer.

    Raises NotActive when nothing holds the claim, its owner does not take the command
    (another generation, a finished attempt, a worker that is gone) or no answer comes in
    time; the command carries its deadline, and a worker that receives it later drops it,
    so the answer is final. Raises Busy when no broker thread can send it (nothing was
    sent). Nothing is retried.
    """
    if owner is not None:
        timeout = settings.AWAKEN_DELIVERY_TIMEOUT
        try:
            if broker_threads().call(_ask_owner, timeout=timeout + ANSWER_MARGIN,
                                     node=owner_node(owner),
                                     arguments={"run_id": str(run_id),
                                                "generation": generation, "command": command,
                                                "actor": actor, "source": source,
                                                "message": message,
                                                "deadline": time.time() + timeout
                                                - ANSWER_MARGIN}):
                return
        except BrokerFull:
            raise Busy(f"Too many live commands in flight here: the {command} of run "
                       f"{run_id} was not sent. Try again shortly.") from None
        except TimeoutError:
            log.info("run %s: no answer to %s in time", run_id, command)
    NOT_ACTIVE.labels(command).inc()
    if owner is None:
        raise NotActive(f"Run {run_id} has no live attempt.")
    raise NotActive(f"The attempt of run {run_id} did not take the {command}.")


def send_command(*, run_id, generation: int, owner: str, command: str,
                 actor: str | None = None, source: str | None = None) -> None:
    """Send a live command and wait for nobody: the durable path stands behind it. No answer
    is asked for, so the worker sends none; it drops the command past its deadline."""
    broker_threads().post(_ask_owner, node=owner_node(owner), reply=False,
                          arguments={"run_id": str(run_id), "generation": generation,
                                     "command": command, "actor": actor, "source": source,
                                     "deadline": time.time()
                                     + settings.AWAKEN_DELIVERY_TIMEOUT})


# Replies a command's collection may pass over before its own: late answers to earlier
# commands of this thread, which reach the same reply queue (kombu names it after the
# thread and an object's address, which the next call's mailbox often takes again).
STALE_REPLIES = 16


class _Answered(Exception):
    """The answer to this command came: stop collecting (raised from the reply callback)."""


def _ask_owner(*, node: str, arguments: dict, reply: bool = True) -> bool:
    """On a broker thread: the remote-control command to one worker node, and its answer
    (whether the attempt took it) if ``reply``.

    Only this command's own answer ends the wait, at once. The collection under Celery's
    ``broadcast`` counts every reply it reads against ``limit``, this command's or
    another's, so with ``limit=1`` a late answer to an earlier command (a worker thawed
    after the asker gave up) ended the wait with no answer, and the command was reported
    not taken while the worker went on to take it. The limit is left wide and the
    callback, which sees only this command's replies, stops the collection when its answer
    is in. The late answers the collection read are then dropped (``runs.workers.kombu``)."""
    threads = broker_threads()
    answers = []

    def answered(body):
        answers.append(body)
        raise _Answered

    try:
        current_app.control.broadcast(
            COMMAND, arguments=arguments, destination=[node], reply=reply,
            limit=STALE_REPLIES, callback=answered, timeout=settings.AWAKEN_DELIVERY_TIMEOUT,
            connection=threads.broker())
    except _Answered:
        pass
    except Exception:
        threads.forget_broker()
        log.warning("live %s for run %s not sent", arguments["command"], arguments["run_id"],
                    exc_info=True)
        return False
    finally:
        forget_late_answers(current_app.control.mailbox)
    return any(answer.get("applied") for body in answers for answer in body.values())
