"""Run as a program by ``tests/test_preparation.py``: the preparations of the process's
executor as it starts (``get_executor``), in a fresh process on an SQLite database of its
own, with five agents of its own registered after the catalogue's:

* ``gate``, whose preparation waits (10 s at most) until ``wanted``'s has begun;
* ``hung``, whose preparation never returns, an attempt of which waits for it;
* ``first`` and ``second``, which take 0.1 s each;
* ``wanted``, an attempt of which is started once the gate's preparation has begun,
  when the start's preparations have come to the program's agents, as is hung's.

Prints, as JSON, the order in which their preparations began, how the attempt ended, what
the start's preparations returned (the objects frozen), within 60 s, and what the worker
answers ``awaken_prepared`` while they go on and after; then exits, the hung preparation
still on its thread.

    python -m tests.start_preparations DATABASE_FILE
"""

import json
import os
import sys
import threading
import time

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
os.environ["DATABASE_URL"] = f"sqlite:///{sys.argv[1]}"
for name in ("REDIS_URL", "CELERY_BROKER_URL"):  # the in-memory broker and layer
    os.environ.pop(name, None)

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

from runs import domain  # noqa: E402
from runs.models import Run, RunState  # noqa: E402
from runs.runtime import executor as executors  # noqa: E402
from runs.runtime.agent import Agent, register  # noqa: E402
from runs.workers.readiness import awaken_prepared  # noqa: E402

BEGUN: list[str] = []
GATE_BEGUN = threading.Event()
WANTED_BEGUN = threading.Event()


def agent_of(short: str, prepare) -> type[Agent]:
    class Prepared(Agent):
        name = f"test.start.{short}"

        @classmethod
        def prepare(cls):
            BEGUN.append(short)
            prepare()

        async def run(self, ctx):
            return {"ran": short}

    return register(Prepared)


agent_of("gate", lambda: (GATE_BEGUN.set(), WANTED_BEGUN.wait(10)))
HUNG = agent_of("hung", threading.Event().wait)
agent_of("first", lambda: time.sleep(0.1))
agent_of("second", lambda: time.sleep(0.1))
WANTED = agent_of("wanted", WANTED_BEGUN.set)


def main() -> dict:
    call_command("migrate", verbosity=0)
    executors.PREPARE_WAIT = 3.0
    run, _ = domain.run_create(agent=WANTED.name, input={}, dispatch=False)
    waiting, _ = domain.run_create(agent=HUNG.name, input={}, dispatch=False)
    executor = executors.get_executor(node="start")
    GATE_BEGUN.wait(60)
    asked = [awaken_prepared(None)]
    executor.start([run.id, waiting.id])
    try:
        frozen = executor.prepared_all.result(timeout=60)
    except TimeoutError:
        frozen = None
    asked.append(awaken_prepared(None))
    deadline = time.monotonic() + 60
    while (run := Run.objects.get(pk=run.id)).state != RunState.ENDED:
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return {"begun": BEGUN, "end_cause": run.end_cause, "output": run.output,
            "frozen": frozen, "asked": asked}


if __name__ == "__main__":
    print(json.dumps(main()))
