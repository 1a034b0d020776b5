"""A chaos storm: random concurrent cancel, stop, pause, resume and live commands over HTTP,
while real worker processes execute the runs and a fault schedule hits the system; then
SPEC §7 and more is checked on what committed.

The system runs as in production, as processes on the test database: two web processes
(daphne; the callers spread their requests over both), four or more Celery workers, the
beat sweeper, and a Redis server of the test's own (broker and channel layer). Callers
create runs of the demo agents (children with ``demo.parent``, also with
``then_wait_for_input``; inboxes with ``demo.inbox``), look runs and their children up, and
send cancel, stop, pause, resume (with input; ``{"approved": bool}`` for
``demo.approval``) and the live commands cancel, pause, message and wake. Meanwhile the
fault schedule takes turns at:

* ``worker_kill``: kill -9 of a worker, restarted (same node name) a moment later;
* ``worker_freeze``: SIGSTOP of a worker for longer than a lease, then SIGCONT;
* ``redis_restart``: Redis stopped (or killed) and started again, empty;
* ``web_restart``: a web process stopped (SIGTERM or kill -9) and started on its port;
* ``kill_after_resume``: a ``demo.approval`` run resumed, and kill -9 of the worker that
  claims it, before it commits its next step if it can.

A process that exits on its own is started again, as a deployment's process manager would
(and counted: see test_faults.py for the worker that a Redis restart can stop).

Afterwards, besides SPEC §7 on every run (tests/storm.py):

* no zombie: each worker still running reports (``WorkerProcess``, with each lease
  renewal) as many live attempts as it owns in the database, and a killed one owns none;
* no child runs on under an ended parent;
* a resume's input reaches the attempt that continued: a run resumed never asks the same
  question again, a ``demo.approval`` run ends ``failed`` if not approved and
  ``completed`` if approved (unless cancelled or stopped), a ``demo.parent`` returns it;
* every control request is recorded: each cancel or stop the API accepted is an intent or
  a ``*_requested`` event that joined one, naming its caller and source, and every run
  cancelled or stopped names who asked;
* an inbox completes with messages that were sent to it, each once;
* no request is answered 5xx;
* nothing stuck: once the schedule is over and every run is stopped through the API,
  every run ends within a deadline.

Small in CI: 40 runs to start with, 500 operations or more (the callers go on until the
schedule is over) and one fault of each kind, in about a minute and a half. The sizes come
from the environment; a full-size run, alone on the machine:

    CHAOS_RUNS=400 CHAOS_OPS=10000 CHAOS_FAULTS=25 \\
        DATABASE_URL=postgres://... .venv/bin/pytest tests/test_chaos.py -s -p no:cacheprovider

CHAOS_WORKERS (4, at least 4), CHAOS_CALLERS (8), CHAOS_LEASE (seconds, 2) and CHAOS_SEED
set the rest. It prints its counts: operations by answer, faults by kind, ends by cause.
The processes' logs are kept in the test's temporary directory.
"""

import http.client
import json
import os
import random
import shutil
import threading
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
from django.db import connections
from django.utils import timezone

from awaken_site.request_share import RETRY_AFTER
from harness.processes import (
    Beat,
    PrivateRedis,
    Processes,
    ProcessFailed,
    Web,
    Worker,
    wait_until,
)
from runs.domain.keys import api_key_issue
from runs.models import (
    Attempt,
    AttemptState,
    CloseReason,
    ControlIntent,
    EndCause,
    EventKind,
    ResumeTicket,
    Run,
    RunState,
    TicketReason,
    TicketState,
    WorkerProcess,
)
from tests.conftest import make_user
from tests.storm import check_every_run_ended_once, ends

RUNS = int(os.getenv("CHAOS_RUNS", "40"))
OPS = int(os.getenv("CHAOS_OPS", "500"))
FAULTS = int(os.getenv("CHAOS_FAULTS", "5"))
WORKERS = max(4, int(os.getenv("CHAOS_WORKERS", "4")))
CALLERS = int(os.getenv("CHAOS_CALLERS", "8"))
LEASE = float(os.getenv("CHAOS_LEASE", "2"))
SEED = int(os.getenv("CHAOS_SEED", "20261201"))

FAULT_KINDS = ("worker_kill", "worker_freeze", "redis_restart", "web_restart",
               "kill_after_resume")
# A process started again on this loaded machine serves within this many seconds.
READY_SECONDS = 90
# The longest a request may take (a cancel waits at most one second for its end).
CALL_SECONDS = 20
BUSY_TRIES = 5  # a 503 busy answer, asked again after its Retry-After, at most this often
# Once the faults are over, the system settles within a few leases (a run lost with a
# frozen or killed worker is found when its lease expires, and claimed again).
SETTLE_SECONDS = max(30.0, 10 * LEASE)

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server"),
    pytest.mark.timeout(int(300 + OPS * 0.2 + FAULTS * 30)),
]


@dataclass
class System:
    redis: PrivateRedis
    webs: list[Web]
    workers: list[Worker]
    beat: Beat


def owner(worker: Worker) -> str:
    """The owner its attempts name: node and pid."""
    return f"{worker.node}:{worker.pid}"


@pytest.fixture
def system(tmp_path):
    """A private Redis, two web processes, the workers and beat, on the test database."""
    redis = PrivateRedis(log_dir=tmp_path).wait_ready(10)
    env = {"REDIS_URL": redis.url, "CELERY_BROKER_URL": None,
           "AWAKEN_LEASE_SECONDS": str(LEASE), "AWAKEN_DELIVERY_TIMEOUT": "0.5",
           # Runs lost with a worker come back however often the schedule strikes them.
           "AWAKEN_MAX_CRASH_RETRIES": "1000",
           # Eight processes share the database server with everyone else's.
           "DB_POOL_MAX": "8", "AWAKEN_DB_THREADS": "4",
           "ALLOWED_HOSTS": "127.0.0.1,localhost"}
    try:
        with Processes() as processes:
            webs = [processes.add(Web(name=f"web{i}", extra_env=env, log_dir=tmp_path))
                    for i in range(2)]
            workers = [processes.add(Worker(f"chaos{i}", lease_seconds=LEASE, extra_env=env,
                                            broker=redis.url, log_dir=tmp_path))
                       for i in range(WORKERS)]
            beat = processes.add(Beat(lease_seconds=LEASE, extra_env=env, log_dir=tmp_path))
            processes.wait_ready(READY_SECONDS)
            yield System(redis, webs, workers, beat)
    finally:
        redis.stop()


def logged_errors(webs: list[Web], most: int = 5) -> str:
    """The first ``most`` 500s the web processes logged, each with its traceback (the
    line of Django's ``django.request`` logger and the indented lines after it), for a
    failure's message: the processes' logs go with the test's temporary directory."""
    found = []
    for web in webs:
        entry = None
        for line in web.log().splitlines():
            if entry is not None and line.startswith(" "):
                entry.append(line)
                continue
            entry = None
            if " ERROR django.request " in line and len(found) < most:
                entry = [f"{web.name}: {line}"]
                found.append(entry)
    return "\n".join(line for entry in found for line in entry)


def random_spec(rng: random.Random) -> dict:
    """A run of one of the demo agents, children and inboxes included."""
    kind = rng.choice(["steps", "approval", "hang", "late", "parent", "parent_waits", "inbox"])
    if kind == "steps":
        return {"agent": "demo.steps", "input": {"steps": rng.randint(1, 6),
                                                 "step_seconds": rng.choice([0.05, 0.2, 0.5])}}
    if kind == "approval":
        return {"agent": "demo.approval", "input": {"step_seconds": 0.3, "steps_after": 2}}
    if kind == "hang":
        return {"agent": "demo.hang"}
    if kind == "late":
        return {"agent": "demo.late", "input": {"late_seconds": 0.3}}
    if kind == "inbox":
        return {"agent": "demo.inbox"}
    child = rng.choice([{"child_agent": "demo.hang"},
                        {"child_agent": "demo.steps",
                         "child_input": {"steps": 2, "step_seconds": 0.2}}])
    return {"agent": "demo.parent",
            "input": {"children": rng.randint(1, 3), **child,
                      "then_wait_for_input": kind == "parent_waits"}}


@dataclass(frozen=True)
class Caller:
    actor: str  # the operator's username
    token: str


@dataclass(frozen=True)
class EndRequest:
    """A cancel or stop the API accepted (200 or 202), with the run it answered."""

    action: str
    run_id: str
    reason: str  # unique to the request: it finds the request's record
    actor: str
    answer: dict


@dataclass(frozen=True)
class Resume:
    """A resume answered 200."""

    run_id: str
    ticket: str
    reason: str  # the ticket's reason
    input: dict


@dataclass
class Storm:
    """The callers' shared record: the runs they know, what they asked, the answers."""

    webs: list[Web]
    lock: threading.Lock = field(default_factory=threading.Lock)
    runs: list[str] = field(default_factory=list)
    known: set[str] = field(default_factory=set)
    ended: set[str] = field(default_factory=set)  # runs an answer showed ended
    inboxes: list[str] = field(default_factory=list)
    parents: list[str] = field(default_factory=list)
    answers: Counter = field(default_factory=Counter)
    server_errors: list = field(default_factory=list)
    end_requests: list[EndRequest] = field(default_factory=list)
    resumes: list[Resume] = field(default_factory=list)
    sent: dict = field(default_factory=lambda: defaultdict(list))  # run id -> messages
    resent: dict = field(default_factory=lambda: defaultdict(list))  # sent to a second web
    over: threading.Event = field(default_factory=threading.Event)  # stop everything

    # Weights: runs are made about as fast as they end, so that faults always find some
    # live on every worker.
    VERBS = {"look": 1, "create": 1.5, "children": 0.6, "cancel": 0.7, "stop": 0.4,
             "cancel_then_stop": 0.3, "pause": 1.2, "resume": 2, "deliver_cancel": 0.3,
             "deliver_pause": 0.5, "message": 2, "wake": 0.8}

    def call(self, rng, verb: str, caller: Caller, method: str, path: str, body=None,
             resent=None):
        """One request to either web process, chosen at random. A web process that does not
        answer (it is restarting) counts as ``unreachable``, and the request goes once to
        the other, as a client fails over; ``resent()`` is called then, since the first may
        have been carried out all the same. A 503 ``busy`` (the process's share was full,
        as the API allows: the request was not served) is asked again after its
        Retry-After, as a client does, a few times.
        Returns (status, body), or (None, None)."""
        for tried, web in enumerate(rng.sample(self.webs, len(self.webs))):
            if tried and resent is not None:
                resent()
            try:
                for _ in range(BUSY_TRIES):
                    status, answer = web.call(method, path, body, token=caller.token,
                                              timeout=CALL_SECONDS)
                    if not (status == 503 and isinstance(answer, dict)
                            and answer.get("code") == "busy"):
                        break
                    self.count(verb, "busy")
                    time.sleep(RETRY_AFTER)
            except (OSError, http.client.HTTPException):
                self.count(verb, "unreachable")
                continue
            self.count(verb, status)
            self.note(answer)
            if status >= 500:
                with self.lock:
                    self.server_errors.append((verb, method, path, status, str(answer)[:500]))
            return status, answer
        return None, None

    def count(self, verb: str, answer) -> None:
        with self.lock:
            self.answers[(verb, answer)] += 1

    def add(self, runs: list[dict]) -> None:
        with self.lock:
            for run in runs:
                if run["id"] in self.known:
                    continue
                self.known.add(run["id"])
                self.runs.append(run["id"])
                if run["agent"] == "demo.inbox":
                    self.inboxes.append(run["id"])
                elif run["agent"] == "demo.parent":
                    self.parents.append(run["id"])

    def note(self, answer) -> None:
        """Remember the runs an answer shows ended."""
        if not isinstance(answer, dict):
            return
        shown = answer.get("results") or [answer.get("run", answer)]
        with self.lock:
            self.ended.update(run["id"] for run in shown if isinstance(run, dict)
                              and run.get("state") == RunState.ENDED and "id" in run)

    def pick(self, rng, among: list[str] | None = None) -> str:
        """Mostly a run not seen ended yet; now and then any."""
        with self.lock:
            among = among or self.runs
            if rng.random() < 0.8:
                among = [run_id for run_id in among if run_id not in self.ended] or among
            return rng.choice(among)

    # --- the operations ----------------------------------------------------------------

    def operate(self, rng, caller: Caller, count: int, faults_over: threading.Event) -> None:
        """Random operations: ``count`` of them, and on until the fault schedule is over."""
        verbs, weights = list(self.VERBS), list(self.VERBS.values())
        done = 0
        while not self.over.is_set() and (done < count or not faults_over.is_set()):
            verb = rng.choices(verbs, weights)[0]
            getattr(self, verb)(rng, caller, tag=f"{caller.actor}-{done}")
            done += 1

    def look(self, rng, caller, tag):
        self.call(rng, "look", caller, "GET", f"/api/runs/{self.pick(rng)}/")

    def create(self, rng, caller, tag):
        status, run = self.call(rng, "create", caller, "POST", "/api/runs/", random_spec(rng))
        if status == 201:
            self.add([run])

    def children(self, rng, caller, tag):
        if not self.parents:
            return
        parent = self.pick(rng, self.parents)
        status, page = self.call(rng, "children", caller, "GET",
                                 f"/api/runs/?parent_id={parent}")
        if status == 200:
            self.add(page["results"])

    def cancel(self, rng, caller, tag, action="cancel", run_id=None, wait=None):
        run_id, reason = run_id or self.pick(rng), f"{action} {tag}"
        wait = rng.choice([0, 0, 0, 1]) if wait is None else wait
        status, run = self.call(rng, action, caller, "POST",
                                f"/api/runs/{run_id}/{action}/?wait={wait}", {"reason": reason})
        if status in (200, 202):
            with self.lock:
                self.end_requests.append(EndRequest(action, run_id, reason, caller.actor, run))

    def stop(self, rng, caller, tag):
        self.cancel(rng, caller, tag, action="stop")

    def cancel_then_stop(self, rng, caller, tag):
        """A cancel and, at once, a stop of the same run: the stop joins the pending cancel
        if the cancel has not landed yet."""
        run_id = self.pick(rng)
        self.cancel(rng, caller, tag, run_id=run_id, wait=0)
        self.cancel(rng, caller, tag, action="stop", run_id=run_id, wait=0)

    def pause(self, rng, caller, tag):
        wait = rng.choice([0, 0, 1])
        self.call(rng, "pause", caller, "POST", f"/api/runs/{self.pick(rng)}/pause/?wait={wait}")

    def resume(self, rng, caller, tag):
        run_id = self.pick(rng)
        status, run = self.call(rng, "look", caller, "GET", f"/api/runs/{run_id}/")
        ticket = (run or {}).get("ticket") if status == 200 else None
        ticket_id = ticket["id"] if ticket else str(uuid.uuid4())  # none: fails closed
        given = {"approved": rng.random() < 0.6, "tag": tag}
        status, _ = self.call(rng, "resume", caller, "POST", f"/api/runs/{run_id}/resume/",
                              {"ticket": ticket_id, "input": given})
        if status == 200:
            with self.lock:
                self.resumes.append(Resume(run_id, ticket_id, ticket["reason"], given))

    def deliver(self, rng, caller, verb: str, run_id: str, body: dict, resent=None):
        self.call(rng, verb, caller, "POST", f"/api/runs/{run_id}/deliver/", body, resent)

    def deliver_cancel(self, rng, caller, tag):
        self.deliver(rng, caller, "deliver_cancel", self.pick(rng), {"command": "cancel"})

    def deliver_pause(self, rng, caller, tag):
        self.deliver(rng, caller, "deliver_pause", self.pick(rng), {"command": "pause"})

    def inbox_target(self, rng) -> str:
        """Mostly an inbox run; now and then any run."""
        return self.pick(rng, self.inboxes if rng.random() < 0.8 else None)

    def message(self, rng, caller, tag):
        run_id = self.inbox_target(rng)
        message = {"done": True} if rng.random() < 0.1 else {"tag": tag}
        with self.lock:
            self.sent[run_id].append(message)  # before: it may be taken, answered or not

        def resent():  # a live message sent again may be taken twice: a client's resend
            with self.lock:
                self.resent[run_id].append(message)

        self.deliver(rng, caller, "message", run_id, {"command": "message", "message": message},
                     resent)

    def wake(self, rng, caller, tag):
        self.deliver(rng, caller, "wake", self.inbox_target(rng), {"command": "wake"})


class Supervisor:
    """Starts again a process that exited on its own, as a deployment's process manager
    does; the fault schedule holds ``lock`` while it stops and starts processes itself."""

    def __init__(self, system: System):
        self.processes = [system.redis, *system.webs, *system.workers, system.beat]
        self.lock = threading.Lock()
        self.exits = Counter()  # process name -> times it exited on its own
        self.gone: list[str] = []  # owners of the worker processes that exited
        self.stopped = threading.Event()
        self.failure: ProcessFailed | None = None
        self.thread = threading.Thread(target=self.watch, name="supervisor", daemon=True)
        self.thread.start()

    def watch(self) -> None:
        try:
            while not self.stopped.wait(0.5):
                with self.lock:
                    for process in self.processes:
                        if not process.running():
                            self.revive(process)
        except ProcessFailed as error:
            self.failure = error

    def revive(self, process) -> None:
        self.exits[process.name] += 1
        if isinstance(process, Worker):
            self.gone.append(owner(process))
        process.start().wait_ready(READY_SECONDS)

    def stop(self) -> None:
        """Stop watching; fail if a process could not be started again."""
        self.stopped.set()
        self.thread.join(READY_SECONDS)
        if self.failure is not None:
            raise self.failure


class Faults:
    """The fault schedule: one fault after another, each kind in turn in a shuffled order,
    with a random pause between them while the storm goes on."""

    def __init__(self, system: System, storm: Storm, rng: random.Random, caller: Caller,
                 supervisor: Supervisor):
        self.system, self.storm, self.rng, self.caller = system, storm, rng, caller
        self.supervisor = supervisor
        self.counts = Counter()
        self.killed: list[str] = []  # owners of the worker processes killed
        self.crashes_after_resume: list[tuple[str, bool]] = []  # run id, before its next step
        self.over = threading.Event()

    def run(self, count: int) -> None:
        kinds = [FAULT_KINDS[i % len(FAULT_KINDS)] for i in range(count)]
        self.rng.shuffle(kinds)
        try:
            for kind in kinds:
                if self.hold(self.rng.uniform(0.5, 2.0)):
                    return
                with self.supervisor.lock:
                    getattr(self, kind)()
                self.counts[kind] += 1
        finally:
            self.over.set()
            connections.close_all()

    def hold(self, seconds: float) -> bool:
        """A timed hold of the schedule; True if the storm was called off meanwhile."""
        return self.storm.over.wait(seconds)

    def worker_kill(self) -> None:
        self.kill(self.rng.choice(self.system.workers))

    def kill(self, worker: Worker) -> None:
        """kill -9, and a restart with the same node name after a moment without it."""
        self.killed.append(owner(worker))
        worker.kill()
        self.hold(self.rng.uniform(0, LEASE))
        worker.start().wait_ready(READY_SECONDS)

    def worker_freeze(self) -> None:
        worker = self.rng.choice(self.system.workers)
        worker.freeze()
        try:
            self.hold(LEASE * self.rng.uniform(1.5, 2.5))  # longer than a lease
        finally:
            worker.thaw()

    def redis_restart(self) -> None:
        redis = self.system.redis
        if self.rng.random() < 0.5:
            redis.kill()
        else:
            redis.stop()
        self.hold(self.rng.uniform(0.2, 1.5))
        redis.start().wait_ready(10)

    def web_restart(self) -> None:
        web = self.rng.choice(self.system.webs)
        web.restart(kill=self.rng.random() < 0.5).wait_ready(READY_SECONDS)

    def kill_after_resume(self) -> None:
        """Resume a fresh ``demo.approval`` run of its own (no caller knows it) and kill the
        worker that claims it, as soon as the claim commits."""
        web = self.rng.choice(self.system.webs)
        status, run = web.call("POST", "/api/runs/", {
            "agent": "demo.approval", "input": {"step_seconds": 0.3, "steps_after": 2}},
            token=self.caller.token)
        assert status == 201, run
        run_id = run["id"]
        ticket = wait_until(lambda: ResumeTicket.objects.filter(
            run_id=run_id, state=TicketState.OPEN).values_list("id", flat=True).first(),
            SETTLE_SECONDS, "the approval to be asked")
        given = {"approved": self.rng.random() < 0.7, "tag": f"fault-{len(self.counts)}"}
        status, answer = web.call("POST", f"/api/runs/{run_id}/resume/",
                                  {"ticket": str(ticket), "input": given},
                                  token=self.caller.token)
        assert status == 200, answer
        with self.storm.lock:
            self.storm.resumes.append(Resume(run_id, str(ticket), "approval", given))
        claimed = wait_until(lambda: Run.objects.filter(pk=run_id).exclude(
            state=RunState.QUEUED).first(), SETTLE_SECONDS, "the resumed run to be claimed")
        workers = {owner(worker): worker for worker in self.system.workers}
        if claimed.state != RunState.RUNNING or claimed.owner not in workers:
            self.crashes_after_resume.append((run_id, False))
            return
        self.kill(workers[claimed.owner])
        stepped = Run.objects.get(pk=run_id).events.filter(
            kind=EventKind.STEP, generation=claimed.generation).exists()
        self.crashes_after_resume.append((run_id, not stepped))


def zombies(system: System, killed: list[str], since) -> list[str]:
    """What breaks "no attempt runs on without its claim": a worker process still running
    whose last report (made after ``since``) counts other live attempts than the database
    says it owns, or a killed one that still owns one."""
    live = Counter(Attempt.objects.filter(state=AttemptState.LIVE)
                   .values_list("owner", flat=True))
    reports = {report.owner: report for report in WorkerProcess.objects.all()}
    problems = [f"{name} was killed and owns {live[name]} live attempts"
                for name in killed if live[name]]
    for worker in system.workers:
        name = owner(worker)
        report = reports.get(name)
        if report is None:
            if live[name]:  # it runs attempts, so its executor reports with each renewal
                problems.append(f"{name} owns {live[name]} live attempts and never reported")
        elif report.reported_at < since:
            problems.append(f"{name} has not reported since {since}")
        elif report.live_attempts != live[name]:
            problems.append(f"{name} reports {report.live_attempts} live attempts and owns "
                            f"{live[name]}")
    return problems


def orphans() -> list[str]:
    """Children that have not ended under a parent that has."""
    return [f"{child} ({state}) under ended {parent}" for child, state, parent in
            Run.objects.filter(parent__state=RunState.ENDED).exclude(state=RunState.ENDED)
            .values_list("id", "state", "parent_id")]


def unended() -> list[str]:
    return [f"{run_id} {agent} ({state})" for run_id, agent, state in
            Run.objects.exclude(state=RunState.ENDED).values_list("id", "agent", "state")]


def settle(problems, timeout: float, what: str) -> None:
    """Wait until ``problems()`` finds none; fail with the last ones found."""
    found = []

    def clean():
        found[:] = problems()
        return not found

    try:
        wait_until(clean, timeout, what, every=0.2)
    except TimeoutError as error:
        pytest.fail(f"{error}: {found[:20]}")


def check_every_request_recorded(storm: Storm, runs: dict, events: dict,
                                 callers: set[str]) -> Counter:
    """SPEC §7.8 and §7.12: each cancel or stop the API accepted is on record, as an intent
    of its own or as a ``*_requested`` event that joined a pending one, with its caller and
    source (none is needed when the run had ended already); each run cancelled or stopped
    names who asked, and a child ended for its parent names that parent. Returns how many
    requests were found each way."""
    found = Counter()
    intents = {(str(intent.run_id), intent.reason): intent
               for intent in ControlIntent.objects.all()}
    joined = {(run_id, event.data.get("reason")): event for run_id, history in events.items()
              for event in history if "joined" in event.data}
    for request in storm.end_requests:
        key = (request.run_id, request.reason)
        if key in intents:
            intent = intents[key]
            assert (intent.action, intent.requested_by, intent.source) == (
                request.action, request.actor, "api"), request
            found["intent"] += 1
        elif key in joined:
            event = joined[key]
            assert (event.kind, event.actor, event.source) == (
                f"{request.action}_requested", request.actor, "api"), request
            found["joined"] += 1
        else:
            assert request.answer["state"] == RunState.ENDED, f"no record of {request}"
            found["ended before"] += 1
    applied = {str(intent.run_id): intent
               for intent in ControlIntent.objects.filter(applied_at__isnull=False)}
    for run_id, run in runs.items():
        if run.end_cause not in (EndCause.CANCELLED, EndCause.STOPPED):
            continue
        end = events[run_id][-1]
        assert end.actor and end.source, f"{run_id} {run.end_cause}, and nobody asked"
        intent = applied.get(run_id)
        if intent is None:  # a live-only cancel (deliver): the caller is named on the end
            assert run.end_cause == EndCause.CANCELLED, run_id
            assert end.actor in callers and end.source == "api", (run_id, end.actor)
        else:
            assert (end.actor, end.source) == (intent.requested_by, intent.source), run_id
            assert intent.caused_by_id in (None, run.parent_id), run_id
    return found


def summary(storm: Storm, faults: Faults, supervisor: Supervisor, checked: dict,
            storm_seconds: float, total_seconds: float) -> str:
    """The counts of a storm as a table: operations by verb and answer, faults by kind,
    what each invariant was checked on, and how long it took."""
    verbs = sorted({verb for verb, _ in storm.answers})
    answers = sorted({answer for _, answer in storm.answers}, key=str)
    width = max(map(len, verbs)) + 2
    lines = ["", "operations".ljust(width) + "".join(f"{str(a):>12}" for a in answers)
             + f"{'total':>8}"]
    for verb in verbs:
        counts = [storm.answers.get((verb, answer), 0) for answer in answers]
        lines.append(verb.ljust(width) + "".join(f"{count:>12}" for count in counts)
                     + f"{sum(counts):>8}")
    lines.append("total".ljust(width) + "".join(
        f"{sum(storm.answers.get((verb, answer), 0) for verb in verbs):>12}"
        for answer in answers) + f"{sum(storm.answers.values()):>8}")
    lines += ["", "faults injected"] + [f"  {kind:<20}{faults.counts[kind]:>6}"
                                        for kind in FAULT_KINDS]
    lines.append(f"  {'total':<20}{sum(faults.counts.values()):>6}")
    lines.append(f"  processes that exited on their own and were started again: "
                 f"{sum(supervisor.exits.values())}")
    lines += ["", "invariants checked (on how many)"] + [
        f"  {what:<76}{count:>7}" for what, count in checked.items()]
    lines += ["", f"duration: storm {storm_seconds:.1f} s, every run ended after "
                  f"{total_seconds:.1f} s"]
    return "\n".join(lines)


def check_resumes(storm: Storm, runs: dict, events: dict) -> int:
    """SPEC §7.11: a resume's input reaches the attempt that continues, a crash between
    them included. The run never asks the same question again; ``demo.approval`` ends as
    its answer says and ``demo.parent`` returns the input (unless cancelled or stopped)."""
    for resume in storm.resumes:
        run, history = runs[resume.run_id], events[resume.run_id]
        at = next(index for index, event in enumerate(history)
                  if event.kind == EventKind.RESUMED
                  and event.data.get("ticket") == resume.ticket)
        if resume.reason != TicketReason.MANUAL_PAUSE:
            asked = [event.seq for event in history[at:] if event.kind == EventKind.PAUSED
                     and event.data.get("reason") == resume.reason]
            assert not asked, f"{resume} was asked again"
        if run.end_cause in (EndCause.CANCELLED, EndCause.STOPPED):
            continue
        if resume.reason == TicketReason.APPROVAL and resume.input["approved"]:
            assert run.end_cause == EndCause.COMPLETED, (resume, run.end_cause, run.error)
        elif resume.reason == TicketReason.APPROVAL:
            assert run.end_cause == EndCause.FAILED and "not approved" in run.error, (
                resume, run.end_cause, run.error)
        elif resume.reason == TicketReason.INPUT:
            assert run.end_cause == EndCause.COMPLETED, (resume, run.end_cause, run.error)
            assert run.output["input"] == resume.input, (resume, run.output)
    return len(storm.resumes)


def check_inboxes(storm: Storm, runs: dict) -> int:
    """An inbox that completed holds messages sent to it, each once (twice at most for a
    message the storm sent again to the other web process), ending with
    ``{"done": true}``. Returns how many inboxes were checked."""
    checked = 0
    for run_id, run in runs.items():
        if run.agent != "demo.inbox" or run.end_cause != EndCause.COMPLETED:
            continue
        *messages, last = run.output["messages"]
        assert last == {"done": True}, run.output
        assert all(message in storm.sent[run_id] for message in messages), run.output
        taken = Counter(json.dumps(message) for message in messages)
        allowed = Counter(json.dumps(message) for message in storm.resent[run_id])
        assert all(times <= 1 + allowed[message] for message, times in taken.items()), (
            run.output, storm.resent[run_id])
        checked += 1
    return checked


@pytest.fixture
def supervisor(system):
    watching = Supervisor(system)
    yield watching
    watching.stop()


def test_a_storm_under_faults_keeps_every_guarantee(system, supervisor):
    rng = random.Random(SEED)
    callers = []
    for index in range(CALLERS + 1):
        user = make_user(f"caller{index}", "operator")
        callers.append(Caller(user.username, api_key_issue(user=user)))
    *callers, scheduler = callers
    storm = Storm(list(system.webs))

    # Runs to start with: half one by one, half in batches, spread over both web processes.
    started = time.monotonic()
    for index in range(RUNS // 2):
        storm.create(rng, callers[index % CALLERS], tag="setup")
    while len(storm.runs) < RUNS:
        specs = [random_spec(rng) for _ in range(min(50, RUNS - len(storm.runs)))]
        status, answer = storm.call(rng, "create", callers[0], "POST", "/api/runs/batch/",
                                    {"runs": specs})
        assert status == 201, answer
        storm.add(answer["results"])

    # The storm, with the fault schedule.
    faults = Faults(system, storm, random.Random(SEED + 1), scheduler, supervisor)
    with ThreadPoolExecutor(CALLERS + 1) as pool:
        schedule = pool.submit(faults.run, FAULTS)
        calls = [pool.submit(storm.operate, random.Random(SEED * 100 + index), caller,
                             OPS // CALLERS, faults.over)
                 for index, caller in enumerate(callers)]
        try:
            for future in [schedule, *calls]:
                future.result(timeout=CALL_SECONDS + 600 + OPS)
        finally:
            storm.over.set()
    storm_seconds = time.monotonic() - started

    # It settles: no attempt lives on without its claim, no child under an ended parent.
    since = timezone.now()
    settle(lambda: zombies(system, faults.killed + supervisor.gone, since), SETTLE_SECONDS,
           "each worker's live attempts to be the ones it owns")
    settle(orphans, SETTLE_SECONDS, "every child of an ended parent to end")

    # Nothing stuck: once every run left is stopped through the API, every run ends.
    left = [str(run_id) for run_id in
            Run.objects.exclude(state=RunState.ENDED).values_list("id", flat=True)]
    with ThreadPoolExecutor(CALLERS) as pool:
        list(pool.map(lambda run_id: storm.cancel(rng, scheduler, tag=f"drain {run_id}",
                                                  action="stop", run_id=run_id), left))
    settle(unended, SETTLE_SECONDS, "every run to end")
    total_seconds = time.monotonic() - started

    runs, events = check_every_run_ended_once({resume.run_id for resume in storm.resumes})
    assert not storm.server_errors, (storm.server_errors[:10], logged_errors(system.webs))
    recorded = check_every_request_recorded(storm, runs, events,
                                            {caller.actor for caller in callers})
    resumes = check_resumes(storm, runs, events)
    inboxes = check_inboxes(storm, runs)
    lost = Attempt.objects.filter(close_reason=CloseReason.LOST).count()
    assert sum(faults.counts.values()) == FAULTS
    assert lost, "no fault cost any attempt its claim"

    children = sum(1 for run in runs.values() if run.parent_id is not None)
    print(f"\nchaos: {len(runs)} runs ({children} children), "
          f"{sum(storm.answers.values())} operations by {CALLERS} callers over "
          f"{len(system.webs)} web processes, {WORKERS} workers, lease {LEASE:g} s; "
          f"storm {storm_seconds:.1f} s, every run ended after {total_seconds:.1f} s")
    print("  answers:", dict(sorted(storm.answers.items(), key=str)))
    print("  faults:", dict(faults.counts),
          f"crashes right after a resume: {len(faults.crashes_after_resume)} "
          f"({sum(before for _, before in faults.crashes_after_resume)} before the next step);",
          "exits on their own:", dict(supervisor.exits))
    print("  ends:", ends(runs), f"attempts lost: {lost},",
          f"resumes: {len(storm.resumes)}, cancels and stops accepted: "
          f"{len(storm.end_requests)} {dict(recorded)}, runs left for the drain: {len(left)}, "
          f"messages sent: {sum(map(len, storm.sent.values()))}")
    print(summary(storm, faults, supervisor, {
        "every run ended once (contiguous versions, one ended event, its last)": len(runs),
        "resumed runs: their resume committed before their end": len({
            resume.run_id for resume in storm.resumes}),
        "no zombie: workers whose reports match the live attempts they own": len(
            system.workers),
        "no child left running under an ended parent": children,
        "accepted cancels and stops on record (intent, joined, or ended before)": sum(
            recorded.values()),
        "cancelled or stopped runs naming who asked": sum(
            1 for run in runs.values()
            if run.end_cause in (EndCause.CANCELLED, EndCause.STOPPED)),
        "resume inputs reaching the attempt that continued": resumes,
        "completed inboxes holding only messages sent, each once": inboxes,
        "operations, none answered 5xx": sum(storm.answers.values()),
        "runs left for the drain that ended in time": len(left),
    }, storm_seconds, total_seconds))
