"""What a request costs the web, counted in instructions instead of timed.

A time moves with the machine: with its load, and with its speed, which moved by half within
minutes on some of the machines measured ("The twenty-ninth round" in
docs/performance.md). A saving of a few per cent cannot be told from that. ``bench
instructions`` runs this module as a program under valgrind's callgrind, which counts the
instructions the process executes, in all its threads: for the same code and the same
requests the count barely moves, whatever the machine does meanwhile.

The program serves requests to the site's ASGI application (``awaken_site.asgi``: what daphne
hands each request to, so everything of a request but daphne's and Twisted's reading and
writing of it) on one event loop, one request at a time, in phases: a warm-up, then creates
(``POST /api/runs/``), then reads of one run (``GET /api/runs/{id}/``), then cancels of the
runs it made, each held by an attempt of a worker that is not there (``POST
/api/runs/{id}/cancel/?wait=0``: the intent committed and the live command sent to the
attempt's worker through the broker, no answer waited for). The claims of those runs, a
phase of their own, are not reported. After each phase it
says ``done <phase>`` and waits for a line; meanwhile the benchmark has callgrind write out
its counts (``callgrind_control --dump``), which starts them again from zero. What a
request's hooks hand to other threads (the change's publication, the run's dispatch to a
worker) is counted with the request, as in the web; a hook still running when a phase ends
falls into the next phase's count. Each thread is counted apart, and the busiest of a phase,
the request's own thread, is also given alone: its count is the steady one, as the other
threads' work depends on time (callgrind slows them as it slows everything). The runs it
made are ended at its end, and the queue their dispatches went to (one of its own) is
deleted.
"""

import asyncio
import json
import os
import select
import subprocess
import sys
import uuid
from pathlib import Path

PHASES = ("warm-up", "create", "get", "claim", "cancel")
NOBODY = "instructions@nowhere:1"  # the owner of the attempts the cancels go to
WARM = 20  # requests of each kind before the counted ones
PHASE_SECONDS = 900.0  # callgrind runs Python some fifty times slower than it runs alone
SPEC = {"agent": "demo.steps", "input": {"steps": 1}}


def instructions_bench(requests: int, warm: int = WARM) -> list:
    """Rows of the instructions a create and a read cost the web, in thousands a request."""
    from harness.processes import ROOT, environment, scratch_folder

    queue = f"awaken-instructions-{uuid.uuid4().hex[:8]}"
    with scratch_folder("awaken-instructions-") as folder:  # kept, with its log, on failure
        counted = counted_phases(
            [sys.executable, "-m", "harness.instructions", str(requests), str(warm)], PHASES,
            env=environment({"PYTHONHASHSEED": "0", "AWAKEN_QUEUE": queue}), cwd=ROOT,
            folder=folder)
    note = (f"{requests} after {warm} of each; callgrind, every thread of the process; the "
            "ASGI application daphne calls, daphne's and Twisted's own work left out")
    alone = ("the phase's busiest thread: the request's own, Django's handler and the "
             "view, without what its hooks hand to other threads; steadier than the whole")
    rows = []
    for phase, label in (("create", "POST /api/runs/ (create)"),
                         ("get", "GET /api/runs/{id}/"),
                         ("cancel", "POST /api/runs/{id}/cancel/, running, no wait")):
        threads = counted[phase]
        rows += [("count", f"instructions a request, {label} (thousands)",
                  sum(threads) / requests / 1e3, note),
                 ("count", "  of which the request's thread (thousands)",
                  max(threads) / requests / 1e3, alone)]
    return rows


def counted_phases(command: list[str], phases, *, env: dict, cwd, folder: Path
                   ) -> dict[str, list[int]]:
    """Run ``command`` under callgrind, its counts and log written in ``folder``. Each time
    it says ``done <phase>`` (the ``phases`` in order), have callgrind write out its counts
    under that phase's name, which starts them again, then give the program a line to go
    on. The instructions of each phase, the first with the program's start, by thread (in
    callgrind's order of threads). RuntimeError if the program says or does otherwise."""
    out = folder / "callgrind.out"
    with open(folder / "valgrind.log", "w+") as log:
        program = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--separate-threads=yes",
             f"--callgrind-out-file={out}.%p", *command],
            cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
            text=True)
        try:
            for phase in phases:
                said = line_within(program, PHASE_SECONDS)
                if said != f"done {phase}":
                    raise RuntimeError(f"the counted program said {said!r}, not "
                                       f"'done {phase}': {tail(log)}")
                dumped = subprocess.run(
                    ["callgrind_control", f"--dump={phase}", str(program.pid)],
                    capture_output=True, text=True, timeout=120)
                if dumped.returncode != 0:
                    raise RuntimeError(f"callgrind_control could not write out the "
                                       f"counts: {(dumped.stdout + dumped.stderr)[-500:]}")
                program.stdin.write("\n")
                program.stdin.flush()
            if program.wait(PHASE_SECONDS) != 0:
                raise RuntimeError(f"the counted program failed: {tail(log)}")
        finally:
            if program.poll() is None:
                program.kill()
                program.wait()
    return dumped_totals(folder)


def tail(log, size: int = 2000) -> str:
    """The end of what was written to the open file ``log``."""
    log.flush()
    log.seek(0)
    return log.read()[-size:]


def line_within(program: subprocess.Popen, seconds: float) -> str:
    """The program's next line on its standard output, stripped; '' if it ended first.
    TimeoutError if none comes within ``seconds``."""
    ready, _, _ = select.select([program.stdout], [], [], seconds)
    if not ready:
        raise TimeoutError(f"the counted program said nothing in {seconds:.0f} s")
    return program.stdout.readline().strip()


def dumped_totals(folder: Path) -> dict[str, list[int]]:
    """The instructions counted in each dump that callgrind wrote in ``folder``, by the name
    the dump was asked for with (``callgrind_control --dump=NAME``), a count for each
    thread (``--separate-threads``: a file each), in callgrind's order of threads."""
    totals: dict[str, dict[int, int]] = {}
    for path in folder.glob("callgrind.out.*"):
        name = thread = total = None
        with open(path) as dump:
            for line in dump:
                if line.startswith("desc: Trigger: dump "):
                    name = line.removeprefix("desc: Trigger: dump ").strip()
                elif line.startswith("thread:"):
                    thread = int(line.split()[1])
                elif line.startswith("totals:"):
                    total = int(line.split()[1])
        if name is not None and total is not None:
            totals.setdefault(name, {})[thread or 1] = total
    return {name: [by_thread[key] for key in sorted(by_thread)]
            for name, by_thread in totals.items()}


# --- the counted program -----------------------------------------------------------------------


def main(requests: int, warm: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "awaken_site.settings")
    from awaken_site.asgi import application  # sets Django up
    from harness.processes import issued_key

    token = issued_key("bench-instructions", "operator")
    made: list[str] = []
    held: list = []
    try:
        asyncio.run(serve(application, token, requests, warm, made, held))
    finally:
        tidy(made, held)


async def serve(app, token: str, requests: int, warm: int, made: list[str],
                held: list) -> None:
    async def create():
        status, body = await asgi_request(app, token, "POST", "/api/runs/",
                                          json.dumps(SPEC).encode())
        assert status == 201, (status, body[:500])
        made.append(json.loads(body)["id"])

    async def get():
        status, body = await asgi_request(app, token, "GET", f"/api/runs/{made[0]}/")
        assert status == 200, (status, body[:500])

    async def claim(count):
        """Have the last ``count`` runs made held by attempts of ``NOBODY``."""
        claimed = await asyncio.to_thread(hold, made[-count:], held)
        del made[-count:]
        return claimed

    async def cancel():
        status, body = await asgi_request(app, token, "POST", f"/api/runs/{cancels.pop()}"
                                          "/cancel/", b"{}", query="wait=0")
        assert status == 202, (status, body[:500])  # asked, not yet ended

    cancels = []
    for phase, calls in zip(PHASES, ([create, get] * warm + [create] * warm,
                                     [create] * requests, [get] * requests, [], [cancel] *
                                     requests), strict=True):
        if phase == "claim":
            cancels = await claim(requests)
        for call in calls:
            await call()
        if phase == "warm-up":
            cancels = await claim(warm)
            for _ in range(warm):
                await cancel()
        print(f"done {phase}", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # while the counts are written out


async def asgi_request(app, token: str, method: str, path: str, body: bytes = b"",
                       query: str = "") -> tuple[int, bytes]:
    """One HTTP request to the ASGI application ``app``, as daphne hands it one from a
    client that stays connected; its status and body."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
        "query_string": query.encode(), "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Token {token}".encode()),
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000),
    }
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive():
        if incoming:
            return incoming.pop()
        await asyncio.Event().wait()  # the client stays until the answer is written

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], b"".join(message.get("body", b"") for message in sent[1:])


def hold(run_ids: list[str], held: list) -> list[str]:
    """Have the queued runs ``run_ids`` claimed by attempts of ``NOBODY``, noted in ``held``
    (id, generation) for ``tidy`` to end; their ids."""
    from runs import domain

    attempts = domain.attempts_start(run_ids=run_ids, owner=NOBODY, lease_seconds=3600)
    held += [(str(attempt.run_id), attempt.generation) for attempt in attempts]
    assert len(attempts) == len(run_ids), "a run the program made was not claimed"
    return [str(attempt.run_id) for attempt in attempts]


def tidy(made: list[str], held: list) -> None:
    """End the runs the program made (cancel those queued, end as cancelled the attempts of
    ``held``), and delete the queue their dispatches went to."""
    from django.conf import settings

    from awaken_site.celery import app
    from harness.processes import wait_until
    from runs import domain
    from runs.workers.dispatch import dispatches

    for run_id in made:
        domain.run_cancel(run_id=run_id, actor="bench", source="cli")
    for run_id, generation in held:
        domain.attempt_finish(run_id=run_id, generation=generation,
                              ending=domain.Ending.cancelled(), actor=NOBODY)
    wait_until(dispatches.idle, 60, "the runs' dispatches to be sent")
    queue = settings.CELERY_TASK_DEFAULT_QUEUE  # its exchange has its name (Celery's default)
    with app.connection_for_write() as broker:
        channel = broker.default_channel
        channel.queue_purge(queue)
        channel.queue_delete(queue)
        channel.exchange_delete(queue)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
