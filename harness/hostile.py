"""Hostile input thrown at a real web process: the attack that ``manage.py bench hostile``
(and ``tests/test_hostile_memory.py``, small) runs, with what ``harness/hostile_input.py``
makes.

The attack is the issue's list, phase by phase: schemathesis against the site's own OpenAPI
document, hostile bodies spliced into the bodies schemathesis makes, the websocket fuzzer,
large inputs, ``GET /api/runs/?limit=500`` over them in parallel, sockets that never read,
and the messages that once crashed a socket consumer. Between the phases a sampler thread
reads the process's resident memory; around them, a unit of normal work (requests, a socket
and its pushes) is timed in the process's CPU. Everything here only counts and measures: the
caller decides what to assert.
"""

import base64
import http.client
import json
import os
import random
import socket
import statistics
import string
import struct
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from harness.hostile_input import CRASHERS, bad_frame, hostile_body, hostile_kinds
from harness.processes import wait_until
from runs.sockets.daphne import TIMEOUTS

MiB = 1024 * 1024

# --- measuring a process ------------------------------------------------------------------------

def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid``."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def threads(pid: int) -> int:
    """How many threads process ``pid`` has."""
    return len(os.listdir(f"/proc/{pid}/task"))


class Sampler:
    """A thread that reads a process's resident memory every ``every`` seconds; ``phase``
    records the peak seen while its block runs."""

    def __init__(self, pid: int, every: float = 0.05):
        self.pid, self.every = pid, every
        self.peak = 0
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (OSError, RuntimeError):
                return

    @contextmanager
    def phase(self, name: str):
        self.peak = rss_bytes(self.pid)
        try:
            yield
        finally:
            self.peak = max(self.peak, rss_bytes(self.pid))
            self.peaks[name] = self.peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


# --- the target -------------------------------------------------------------------------------

@dataclass
class Target:
    """A web process to attack: its port and pid, a log to count crashes in, an
    operator's and a viewer's API key."""

    port: int
    pid: int
    operator: str
    viewer: str
    log: object = None  # a callable returning the process's output so far

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def logged_crashes(self) -> int:
        """Crashes the process logged so far: an application that raised (daphne) and
        requests that ended in a server error (Django)."""
        if self.log is None:
            return 0
        text = self.log()
        return text.count("Exception inside application") + text.count("Internal Server Error")


class Http:
    """A keep-alive HTTP connection with one API key; answers are (status, raw body)."""

    def __init__(self, target: Target, key: str, timeout: float = 120):
        self.target = target
        self.headers = {"Authorization": f"Token {key}", "Content-Type": "application/json"}
        self.timeout = timeout
        self.connection = http.client.HTTPConnection("127.0.0.1", target.port,
                                                     timeout=timeout)

    def send(self, method: str, path: str, text: str | bytes | None = None):
        body = text.encode() if isinstance(text, str) else text
        for attempt in (1, 2):
            try:
                self.connection.request(method, path, body=body, headers=self.headers)
                response = self.connection.getresponse()
                data = response.read()
                if response.getheader("Connection", "").lower() == "close":
                    self.reconnect()
                return response.status, data
            except (ConnectionError, http.client.HTTPException):
                self.reconnect()  # the server closed a kept-alive connection, or refused
                if attempt == 2:   # to read a body it answers 413 to: once more, anew
                    raise

    def json(self, method: str, path: str, body=None):
        status, data = self.send(method, path, None if body is None else json.dumps(body))
        return status, json.loads(data or b"null")

    def reconnect(self) -> None:
        self.connection.close()
        self.connection = http.client.HTTPConnection("127.0.0.1", self.target.port,
                                                     timeout=self.timeout)

    def close(self) -> None:
        self.connection.close()


@dataclass
class Outcome:
    """What one phase tried and got."""

    name: str
    tried: int = 0
    answers: Counter = field(default_factory=Counter)  # HTTP status, or ws close code
    unexpected: list = field(default_factory=list)  # a few examples, for the report
    peak: int = 0
    seconds: float = 0.0
    logged_crashes: int = 0

    def got(self, answer, expected: bool = True, example=None) -> None:
        self.answers[answer] += 1
        if not expected and len(self.unexpected) < 5:
            self.unexpected.append((answer, example))

    @property
    def server_errors(self) -> int:
        return sum(count for answer, count in self.answers.items()
                   if isinstance(answer, int) and 500 <= answer < 600)

    @property
    def crashes(self) -> int:
        """Sockets closed as a server error (1011), or crashes in the log."""
        return self.answers.get("ws 1011", 0) + self.logged_crashes


# --- normal work ------------------------------------------------------------------------------

NORMAL_RUN = {"agent": "demo.steps", "input": {"steps": 1, "step_seconds": 0}}

# The shipped agent of each framework adapter: the attack starts them (the document lists
# them), and each one's first run imports its framework, a hundred MiB and more in all.
FRAMEWORK_AGENTS = ("pydantic_ai.chat", "openai_agents.chat", "langgraph.chat")


def normal_work(target: Target, requests_: int = 100) -> int:
    """``requests_`` ordinary requests (a quarter start runs, half read the newest page of
    the list, a quarter read a run) while a viewer's socket follows the list; returns once
    the socket has been pushed the end of every run started. Returns the pushes received."""
    api = Http(target, target.operator)
    created = []
    with ws_connect(f"{target.ws}/ws/runs/", max_size=None, ping_interval=None,
                    additional_headers={"Authorization": f"Token {target.viewer}"}) as sock:
        assert json.loads(sock.recv(timeout=30))["type"] == "snapshot"
        for number in range(requests_):
            if number % 4 == 0:
                status, body = api.json("POST", "/api/runs/", NORMAL_RUN)
                assert status == 201, (status, body)
                created.append(body["id"])
            elif number % 4 == 2 and created:
                status, _ = api.send("GET", f"/api/runs/{created[-1]}/")
                assert status == 200, status
            else:
                status, _ = api.send("GET", "/api/runs/?limit=50")
                assert status == 200, status
        waiting, pushes = set(created), 0
        deadline = time.monotonic() + 120
        while waiting:
            message = json.loads(sock.recv(timeout=max(0.1, deadline - time.monotonic())))
            pushes += 1
            run = message.get("run") or {}
            if run.get("state") == "ended":
                waiting.discard(run.get("id"))
    api.close()
    return pushes


def framework_runs(target: Target) -> list[str]:
    """One run of each shipped framework agent the site serves, each waited for until it
    has ended: what the first runs of an agent framework load is loaded. Returns the
    agents run (a site without the ``frameworks`` extra refuses theirs as invalid)."""
    api = Http(target, target.operator)
    started = {}
    for agent in FRAMEWORK_AGENTS:
        status, body = api.json("POST", "/api/runs/", {"agent": agent, "input": {
            "prompt": "What does a cancel stop?"}})
        if status == 201:
            started[agent] = body["id"]
        elif status != 400:
            raise RuntimeError(f"could not start {agent}: {status} {body}")

    def ended(run_id):
        status, data = api.send("GET", f"/api/runs/{run_id}/")
        return status == 200 and json.loads(data)["state"] == "ended"

    for agent, run_id in started.items():
        wait_until(partial(ended, run_id), 120, f"the {agent} run to end", every=0.1)
    api.close()
    return list(started)


def time_units(target: Target, units: int) -> tuple[float, float, list]:
    """The process's CPU per unit of normal work: median and spread (ms), over ``units``;
    and its trail: the RSS (bytes) and threads of the process after each unit."""
    samples, trail = [], []
    for _ in range(units):
        started = cpu_seconds(target.pid)
        normal_work(target)
        samples.append((cpu_seconds(target.pid) - started) * 1000)
        trail.append((rss_bytes(target.pid), threads(target.pid)))
    spread = statistics.pstdev(samples) if len(samples) > 1 else 0.0
    return statistics.median(samples), spread, trail


def quiet(target: Target, timeout: float = 60, window: float = 2.0) -> float:
    """Wait until the process is idle: under 5 % of a core and its memory steady for
    ``window`` seconds; returns the seconds waited."""
    started = time.monotonic()

    def settled():
        cpu, rss = cpu_seconds(target.pid), rss_bytes(target.pid)
        time.sleep(window)
        return (cpu_seconds(target.pid) - cpu < 0.05 * window
                and abs(rss_bytes(target.pid) - rss) < MiB)

    try:
        wait_until(settled, timeout, "the web process to be quiet", every=0)
    except TimeoutError:
        pass  # measured anyway; the caller prints how long it waited
    return time.monotonic() - started


# --- the phases ------------------------------------------------------------------------------

def fetch_document(target: Target) -> dict:
    api = Http(target, target.viewer)
    api.headers["Accept"] = "application/json"
    status, data = api.send("GET", "/api/schema/?format=json")
    api.close()
    if status != 200:
        raise RuntimeError(f"/api/schema/ answered {status}")
    return json.loads(data)


def operations(document: dict) -> dict:
    import schemathesis

    schema = schemathesis.openapi.from_dict(document)
    return {op.ok().label: op.ok() for op in schema.get_all_operations()}


def schemathesis_phase(target: Target, outcome: Outcome, examples: int) -> None:
    """Schemathesis against the served document, as an operator and as a viewer: every
    operation, ``examples`` cases each. A 5xx is counted; so is an answer the document does
    not describe (as ``contract``)."""
    ops = operations(fetch_document(target))
    session = requests.Session()
    for key in (target.operator, target.viewer):
        headers = {"Authorization": f"Token {key}"}
        for label, operation in sorted(ops.items()):
            fuzz_operation(target, outcome, examples, operation, label, session, headers)
    session.close()


def fuzz_operation(target, outcome, examples, operation, label, session, headers) -> None:
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    @given(case=operation.as_strategy())
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def call(case):
        outcome.tried += 1
        response = case.call(base_url=target.base, session=session, headers=headers,
                             timeout=120)
        outcome.got(response.status_code, response.status_code < 500, label)
        try:
            case.validate_response(response, headers=headers,
                                   excluded_checks=[positive_data_acceptance])
        except Exception:  # noqa: BLE001  a failed check of any kind
            outcome.got("contract", False, label)

    call()


def hostile_bodies_phase(target: Target, outcome: Outcome, examples: int,
                         run_ids: dict) -> None:
    """Each kind of hostile body spliced into ``examples`` bodies of every POST operation:
    each must be refused with a 4xx JSON error."""
    ops = operations(fetch_document(target))
    api = Http(target, target.operator)
    for label, operation in sorted(ops.items()):
        if operation.method != "post":
            continue
        run_id = run_ids["resume" if "resume" in label else "other"]
        path = operation.path.replace("{run_id}", run_id).replace(
            "{token}", "not-a-token").replace("{link_id}", str(uuid.UUID(int=1))).replace(
            "{job_id}", str(uuid.UUID(int=1)))
        for kind in hostile_kinds(label):
            refuse_bodies(api, outcome, examples, operation, f"{label} {kind}", kind, path)
    api.close()


def refuse_bodies(api, outcome, examples, operation, label, kind, path) -> None:
    @given(case=operation.as_strategy(), data=st.data())
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def call(case, data):
        body = case.body if isinstance(case.body, dict) else {}
        text = hostile_body(json.loads(json.dumps(body)), kind, data.draw)
        outcome.tried += 1
        status, answer = api.send("POST", path, text)
        refused = status in (400, 404, 413) and answer.startswith(b"{")
        outcome.got(status, refused, label)

    call()


def socket_fuzz_phase(target: Target, outcome: Outcome, frames: int, seed: int) -> None:
    """``frames`` bad frames as a viewer and as an operator. Each is answered with one
    ``invalid`` error, except frames the protocol itself refuses (over 1 MiB, text that is
    not UTF-8): daphne drops the connection, and the fuzzer connects again. After the last
    frame, a resume still replays."""
    for role, key in (("viewer", target.viewer), ("operator", target.operator)):
        rng = random.Random(f"{seed}-{role}")
        left = frames
        while left > 0:
            left = fuzz_one_socket(target, outcome, rng, key, left)


def fuzz_one_socket(target: Target, outcome: Outcome, rng, key: str, left: int) -> int:
    """Send bad frames on one socket until ``left`` are sent or the server drops it;
    returns how many are left. After the last, a resume must be answered. The client keeps
    every message it has not read (``max_queue=None``): with a bounded queue it would stop
    reading at the replay's sixteenth message, and its close would wait out its timeout for
    a close frame behind the rest."""
    with ws_connect(f"{target.ws}/ws/runs/", max_size=None, max_queue=None, ping_interval=None,
                    additional_headers={"Authorization": f"Token {key}"}) as sock:
        sock.recv(timeout=30)  # the snapshot
        while left > 0:
            kind, frame = bad_frame(rng)
            outcome.tried += 1
            left -= 1
            try:
                if "bytes_data" in frame:
                    sock.send(frame["bytes_data"])
                else:  # a lone surrogate goes out as the bytes it would be: not UTF-8
                    sock.send(frame["text_data"].encode("utf-8", "surrogatepass"), text=True)
                answer = json.loads(skip_pushes(sock))
            except ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd else None
                if code is None:  # dropped by the protocol layer, with no close frame
                    outcome.got(f"dropped ({kind})", kind in ("huge", "surrogate"), kind)
                else:
                    outcome.got(f"ws {code}", False, kind)
                return left
            ok = answer.get("type") == "error" and answer.get("code") == "invalid"
            outcome.got("error invalid" if ok else "other answer", ok, kind)
        sock.send(json.dumps({"type": "resume", "after": 0}))
        answer = json.loads(skip_pushes(sock, errors=True)).get("type")
        replayed = answer in ("run.changed", "snapshot")  # a snapshot when there is much
        outcome.got("resume answered" if replayed else "resume broken", replayed, answer)
    return 0


def skip_pushes(sock, errors: bool = False) -> str:
    """The next message that is not a push of a change (other work goes on meanwhile)."""
    while True:
        text = sock.recv(timeout=30)
        kind = json.loads(text).get("type")
        if kind not in ("run.changed", "bulk.changed", "run.output") or errors:
            return text


def crashers_phase(target: Target, outcome: Outcome, count: int) -> None:
    """``count`` sockets, each sends one of the messages that once crashed the consumer,
    gets its error, and goes: every consumer must answer, and leave the fan-out."""
    for number in range(count):
        message = CRASHERS[number % len(CRASHERS)]
        outcome.tried += 1
        try:
            with ws_connect(f"{target.ws}/ws/runs/", max_size=None, ping_interval=None,
                            additional_headers={
                                "Authorization": f"Token {target.viewer}"}) as sock:
                sock.recv(timeout=30)
                sock.send(message)
                answer = json.loads(skip_pushes(sock))
                ok = answer.get("code") == "invalid"
                outcome.got("error invalid" if ok else "other answer", ok, message[:20])
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            outcome.got(f"ws {code}", False, message[:20])


LARGE = 120 * 1024  # characters of input, and as many of output: under the 256 KiB limit


def large_inputs_phase(target: Target, outcome: Outcome, runs: int) -> list[str]:
    """``runs`` runs whose input and output are each some 120 KiB (created, completed, read
    back whole), and inputs over the limit (refused). Returns the ids made."""
    api = Http(target, target.operator)
    made = []
    for number in range(runs):
        blob = random.Random(number).choice(string.ascii_letters) * LARGE
        status, body = api.json("POST", "/api/runs/", {"agent": "demo.steps", "input": {
            "steps": 1, "step_seconds": 0, "blob": blob, "output": {"blob": blob}}})
        outcome.tried += 1
        outcome.got(status, status == 201, "large input")
        if status == 201:
            made.append(body["id"])
        if number % 10 == 0:
            status, _ = api.send("POST", "/api/runs/", json.dumps({
                "agent": "demo.steps", "input": {"blob": "x" * (300 * 1024)}}))
            outcome.tried += 1
            outcome.got(status, status == 400, "input over the limit")
            status, _ = api.send("POST", "/api/runs/", b"{" + b" " * (3 * MiB) + b"}")
            outcome.tried += 1
            outcome.got(status, status == 413, "body over the limit")
    for run_id in made:
        status, _ = api.send("GET", f"/api/runs/{run_id}/")
        outcome.tried += 1
        outcome.got(status, status == 200, "a large run")
    api.close()
    return made


def big_lists_phase(target: Target, outcome: Outcome, parallel: int, rounds: int) -> None:
    """``GET /api/runs/?limit=500`` from ``parallel`` clients at once, ``rounds`` times
    each, over the large runs."""
    def client(_):
        api = Http(target, target.viewer)
        got = []
        for _ in range(rounds):
            got.append(api.send("GET", "/api/runs/?limit=500")[0])
        api.close()
        return got

    with ThreadPoolExecutor(parallel) as pool:
        for statuses in pool.map(client, range(parallel)):
            for status in statuses:
                outcome.tried += 1
                outcome.got(status, status == 200, "limit=500")


class StalledClient:
    """A websocket client that sends but never reads after the handshake (a raw TCP socket
    with a small receive buffer, so that what the server sends piles up on its side)."""

    def __init__(self, port: int, token: str):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(30)
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((
            f"GET /ws/runs/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\nAuthorization: Token {token}\r\n\r\n").encode())
        response = b""
        while not response.endswith(b"\r\n\r\n"):  # the headers only, byte by byte
            response += self.sock.recv(1)
        if not response.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(response[:200])
        self.spoke = time.monotonic()

    def send_text(self, text: str) -> None:
        payload, mask = text.encode(), os.urandom(4)
        header = bytes([0x81, 0x80 | len(payload)]) if len(payload) < 126 else (
            bytes([0x81, 0x80 | 126]) + struct.pack("!H", len(payload)))
        masked = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
        self.sock.sendall(header + mask + masked)
        self.spoke = time.monotonic()

    def nudge(self, every: float) -> None:
        """Send a word (answered with an error) if the client has said nothing for
        ``every`` seconds: daphne pings only a socket silent for its ping interval, so a
        client that keeps talking is never closed by the ping, only by its buffer."""
        if time.monotonic() - self.spoke >= every:
            try:
                self.send_text('{"type": "still here"}')
            except OSError:
                pass  # closed meanwhile: dropped() says so

    def dropped(self) -> bool:
        """Whether the server closed the connection, seen without reading."""
        info = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
        return info[0] != 1  # TCP_ESTABLISHED, the first byte of struct tcp_info

    def close(self) -> None:
        self.sock.close()


def replayed_after(target: Target, back: int) -> int:
    """A seq at most ``back`` events before the newest whose resume the server answers with
    a replay, not with a snapshot: a replay that would send more than its limit (the events
    after the seq and those of the seconds just before it, which depend on how fast the
    attack wrote them) is answered with a snapshot of the list, too small to fill a buffer.
    Halves ``back`` until one is, asking on a new socket each time (a socket's resumes are
    coalesced)."""
    while True:
        with ws_connect(f"{target.ws}/ws/runs/", max_size=None, ping_interval=None,
                        additional_headers={"Authorization": f"Token {target.viewer}"}) as sock:
            newest = json.loads(sock.recv(timeout=30))["seq"]
            after = max(0, newest - back)
            if after == newest or back <= 1:
                return after
            sock.send(json.dumps({"type": "resume", "after": after}))
            if json.loads(sock.recv(timeout=30))["type"] != "snapshot":
                return after
        back //= 2


def stalled_sockets_phase(target: Target, outcome: Outcome, clients: int, asks: int, *,
                          until_dropped: bool = True) -> None:
    """``clients`` sockets that ask ``asks`` times for a replay of up to the last 900 events
    (some MiB each; ``replayed_after``) and never read: the server must drop each once its
    buffer is full. Each ask is from one event further back than the last, so that none is
    coalesced with the replay before it, and each client keeps talking while it waits
    (``nudge``), so that only its buffer can close it, not daphne's ping. Without
    ``until_dropped`` (the warm-up, before there is much to replay) the clients go once they
    have asked."""
    after = replayed_after(target, 900)
    stalled = [StalledClient(target.port, target.viewer) for _ in range(clients)]
    nudge_every = TIMEOUTS["ping_interval"] / 4

    def all_dropped() -> bool:
        still_open = [client for client in stalled if not client.dropped()]
        for client in still_open:
            client.nudge(nudge_every)
        return not still_open

    try:
        for asked in range(asks):
            for client in stalled:
                client.send_text(json.dumps({"type": "resume",
                                             "after": after + asks - 1 - asked}))
                outcome.tried += 1
        if not until_dropped:
            return
        try:
            wait_until(all_dropped, 120, "the server to drop every stalled client", every=0.1)
        except TimeoutError:
            pass
        for client in stalled:
            dropped = client.dropped()
            outcome.got("dropped" if dropped else "still open", dropped, "stalled")
    finally:
        for client in stalled:
            client.close()


# --- the whole attack ---------------------------------------------------------------------------

@dataclass
class Sizes:
    """How much of each phase; ``Sizes.scaled(0.05)`` for a quick run."""

    schemathesis_examples: int = 25
    hostile_examples: int = 4
    socket_frames: int = 400
    crashers: int = 1500
    large_runs: int = 200
    list_parallel: int = 4
    list_rounds: int = 5
    stalled_clients: int = 20
    stalled_asks: int = 20
    units: int = 5  # units of normal work timed before and after

    @classmethod
    def scaled(cls, scale: float) -> "Sizes":
        full = cls()
        kept = {"units", "stalled_asks"}  # asks enough to fill a buffer, at any scale
        return cls(**{name: value if name in kept else max(1, round(value * scale))
                      for name, value in vars(full).items()})


@dataclass
class Report:
    sizes: Sizes
    rss_before: int = 0
    rss_after: int = 0
    threads_before: int = 0
    threads_after: int = 0
    rss_rounds: list = field(default_factory=list)  # once quiet after each round
    cpu_before: tuple = (0.0, 0.0)
    cpu_after: tuple = (0.0, 0.0)
    trail_before: list = field(default_factory=list)  # (RSS, threads) after each unit
    trail_after: list = field(default_factory=list)
    quiet_seconds: float = 0.0
    outcomes: list = field(default_factory=list)

    @property
    def peak(self) -> int:
        return max((outcome.peak for outcome in self.outcomes), default=0)

    @property
    def tried(self) -> int:
        return sum(outcome.tried for outcome in self.outcomes)

    @property
    def server_errors(self) -> int:
        return sum(outcome.server_errors for outcome in self.outcomes)

    @property
    def crashes(self) -> int:
        return sum(outcome.crashes for outcome in self.outcomes)


def warm_up(target: Target, run_ids: dict, seed: int, sizes: Sizes) -> None:
    """Every path of the attack once, small, and some normal work: what a process loads
    once (modules, the schema, pools, caches, the agent frameworks of the site that runs
    them) is loaded before the first figure."""
    scratch = Outcome("warm-up")
    schemathesis_phase(target, scratch, 1)
    hostile_bodies_phase(target, scratch, 1, run_ids)
    socket_fuzz_phase(target, scratch, 20, seed)
    crashers_phase(target, scratch, len(CRASHERS))
    framework_runs(target)
    large_inputs_phase(target, scratch, 2)
    # As many at once as in the attack: the pools of threads and connections grow to it.
    big_lists_phase(target, scratch, sizes.list_parallel, 1)
    stalled_sockets_phase(target, scratch, 2, 2, until_dropped=False)
    for _ in range(sizes.units):
        normal_work(target)


def attack(target: Target, sizes: Sizes, *, rounds: int = 1, seed: int | None = None,
           say=print) -> Report:
    """Warm up, time normal work, run every phase ``rounds`` times (each one's peak memory
    sampled; the memory once quiet after each round), time normal work again. ``say`` is
    told of each step as it ends."""
    seed = random.SystemRandom().randrange(2**32) if seed is None else seed
    api = Http(target, target.operator)
    status, body = api.json("POST", "/api/runs/", {**NORMAL_RUN, "start_after":
                                                   "2999-01-01T00:00:00+00:00"})
    if status != 201:
        raise RuntimeError(f"could not create a run: {status} {body}")
    api.close()
    run_ids = {"resume": body["id"], "other": body["id"]}
    report = Report(sizes)

    warm_up(target, run_ids, seed, sizes)
    quiet(target)
    median, spread, report.trail_before = time_units(target, sizes.units)
    report.cpu_before = (median, spread)
    report.rss_before = rss_bytes(target.pid)
    report.threads_before = threads(target.pid)
    say(f"before: {report.rss_before / MiB:.1f} MiB, {report.cpu_before[0]:.0f} ms CPU "
        f"per 100 requests")

    sampler = Sampler(target.pid)
    phases = [
        ("schemathesis", lambda o: schemathesis_phase(target, o, sizes.schemathesis_examples)),
        ("hostile bodies", lambda o: hostile_bodies_phase(target, o, sizes.hostile_examples,
                                                          run_ids)),
        ("socket fuzzer", lambda o: socket_fuzz_phase(target, o, sizes.socket_frames, seed)),
        ("crashing socket messages", lambda o: crashers_phase(target, o, sizes.crashers)),
        ("large inputs", lambda o: large_inputs_phase(target, o, sizes.large_runs)),
        ("GET ?limit=500 in parallel", lambda o: big_lists_phase(
            target, o, sizes.list_parallel, sizes.list_rounds)),
        ("sockets that never read", lambda o: stalled_sockets_phase(
            target, o, sizes.stalled_clients, sizes.stalled_asks)),
    ]
    try:
        for round_ in range(1, rounds + 1):
            for name, run in phases:
                name = name if rounds == 1 else f"{name} ({round_})"
                outcome = Outcome(name)
                logged = target.logged_crashes()
                started = time.monotonic()
                with sampler.phase(name):
                    run(outcome)
                outcome.seconds = time.monotonic() - started
                outcome.peak = sampler.peaks[name]
                outcome.logged_crashes = target.logged_crashes() - logged
                report.outcomes.append(outcome)
                say(f"{name}: {outcome.tried} inputs in {outcome.seconds:.0f} s, peak "
                    f"{outcome.peak / MiB:.1f} MiB, {dict(outcome.answers)}")
            report.quiet_seconds = quiet(target)
            report.rss_rounds.append(rss_bytes(target.pid))
            say(f"round {round_}: {report.rss_rounds[-1] / MiB:.1f} MiB once quiet")
    finally:
        sampler.stop()

    median, spread, report.trail_after = time_units(target, sizes.units)
    report.cpu_after = (median, spread)
    report.rss_after = rss_bytes(target.pid)
    report.threads_after = threads(target.pid)
    return report


def table(report: Report) -> list[str]:
    """The report as lines of text."""
    lines = [f"{'phase':<28}{'inputs':>8}{'5xx':>6}{'crashes':>9}{'peak MiB':>10}{'s':>6}  "
             "answers"]
    lines.append("-" * len(lines[0]))
    for outcome in report.outcomes:
        answers = ", ".join(f"{answer}: {count}" for answer, count in sorted(
            outcome.answers.items(), key=lambda item: str(item[0])))
        lines.append(f"{outcome.name:<28}{outcome.tried:>8}{outcome.server_errors:>6}"
                     f"{outcome.crashes:>9}{outcome.peak / MiB:>10.1f}{outcome.seconds:>6.0f}"
                     f"  {answers}")
        for answer, example in outcome.unexpected:
            lines.append(f"{'':<28}unexpected {answer!r}: {str(example)[:80]}")
    lines.append(f"{'all':<28}{report.tried:>8}{report.server_errors:>6}{report.crashes:>9}"
                 f"{report.peak / MiB:>10.1f}")
    lines.append("")
    header = f"{'':<34}{'before':>10}{'peak':>10}{'after':>10}{'after/before':>14}"
    lines += [header, "-" * len(header)]
    lines.append(f"{'daphne RSS (MiB)':<34}{report.rss_before / MiB:>10.1f}"
                 f"{report.peak / MiB:>10.1f}{report.rss_after / MiB:>10.1f}"
                 f"{report.rss_after / report.rss_before:>14.3f}")
    (before, spread_before), (after, spread_after) = report.cpu_before, report.cpu_after
    lines.append(f"{'CPU per 100 requests (ms)':<34}{before:>10.0f}{'':>10}{after:>10.0f}"
                 f"{after / before:>14.3f}")
    if len(report.rss_rounds) > 1:
        lines.append("daphne RSS once quiet after each round (MiB): " + ", ".join(
            f"{rss / MiB:.1f}" for rss in report.rss_rounds))
    lines.append(f"{'threads':<34}{report.threads_before:>10}{'':>10}"
                 f"{report.threads_after:>10}")
    for when, trail in (("before", report.trail_before), ("after", report.trail_after)):
        if len(trail) > 1:
            lines.append(f"RSS (MiB) / threads after each unit {when}: " + ", ".join(
                f"{rss / MiB:.1f}/{count}" for rss, count in trail))
    lines.append(f"(CPU: median of {report.sizes.units} units, spread {spread_before:.0f} and "
                 f"{spread_after:.0f} ms; quiet after {report.quiet_seconds:.0f} s)")
    return lines
