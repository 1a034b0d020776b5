"""Run as a program by ``tests/test_preparation.py``: each agent's first two runs on a fresh
executor, in a fresh process, in turn, on an SQLite database of its own and the provider
stub. Prints, as JSON, the modules imported on the worker's loop during each run (an import
there holds up every attempt of the process) and how each run ended. A run that awaits a
person's approval is approved, and resumed: what it imports from its start to its end.

    python -m tests.first_run_imports DATABASE_FILE AGENT[,AGENT...] [prepared]

With ``prepared``, the executor is made as the process's own is (``get_executor``), and
the runs begin once it has prepared every agent; the imports of any thread are printed
too, and how many objects it froze.
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

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from runs import domain  # noqa: E402
from runs.models import Run, RunState  # noqa: E402
from runs.providers.stub import StubServer  # noqa: E402
from runs.runtime.executor import Executor  # noqa: E402

LOOP_THREAD = "awaken-executor"  # runs.runtime.loop.WorkerLoop's


def main(agents: list[str], prepared: bool = False) -> dict:
    call_command("migrate", verbosity=0)
    imported: list[str] = []
    anywhere: list[str] = []

    def on_event(event, args):
        if event == "import":
            anywhere.append(args[0])
            if threading.current_thread().name == LOOP_THREAD:
                imported.append(args[0])

    sys.addaudithook(on_event)  # for the rest of this process, which is this program's
    runs = []
    with StubServer() as server:
        settings.AWAKEN_PROVIDER_BASE_URL = server.url
        settings.AWAKEN_PROVIDER_MODEL = "echo"
        executor = Executor(node="first-run", lease_seconds=3600, db_threads=1,
                            prepare_all=prepared)
        frozen = executor.prepared_all.result(timeout=120) if prepared else None
        for agent in agents:
            for _ in range(2):
                imported.clear()
                anywhere.clear()
                run, _ = domain.run_create(agent=agent, input={"prompt": "bob@example.com"},
                                           dispatch=False)
                executor.start([run.id])
                run, approvals = ended(run, executor)
                runs.append({"agent": agent, "end_cause": run.end_cause, "error": run.error,
                             "approvals": approvals,
                             "imported_on_the_loop": list(dict.fromkeys(imported)),
                             "imported": list(dict.fromkeys(anywhere))})
    return {"runs": runs, "frozen": frozen}


def ended(run: Run, executor: Executor) -> tuple[Run, int]:
    """``run`` once ended, approved and resumed each time it awaits an approval, and how
    many times it was."""
    deadline, approvals = time.monotonic() + 60, 0
    while (run := Run.objects.get(pk=run.id)).state != RunState.ENDED:
        if run.state == RunState.AWAITING:
            approvals += 1
            domain.run_resume(run_id=run.id, ticket_id=run.ticket_id, input={"approved": True},
                              actor="olga", source="api")
            executor.start([run.id])
        if time.monotonic() > deadline:
            raise TimeoutError(f"the run of {run.agent} did not end in 60 s")
        time.sleep(0.01)
    return run, approvals


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[2].split(","), prepared=sys.argv[3:] == ["prepared"])))
