"""An agent's preparation (``Agent.prepare``): what is slow to make the first time in a
worker process is made off the worker's loop, which every attempt of the process shares,
so that a framework's import at one run's start holds up no other run, nor its cancel."""

import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from harness.processes import ROOT, wait_until
from runs import domain
from runs.domain.catalogue import CATALOGUE
from runs.models import Run, RunState
from runs.runtime.agent import Agent, register
from runs.runtime.token import Why

# A program of its own, on an SQLite database and the in-memory broker of its own: what
# DATABASE_URL and REDIS_URL say changes nothing, so the PostgreSQL stream leaves it out.
OWN_PROCESS = pytest.mark.ignores_database_url

CHAT_AGENTS = ["demo.chat", "pydantic_ai.chat", "openai_agents.chat", "langgraph.chat"]


@OWN_PROCESS
def test_no_module_is_imported_on_the_workers_loop_at_an_agents_first_run(tmp_path):
    """Each shipped chat agent's first run on a fresh worker process (one process a
    framework, so that no agent finds what another framework imported), then its
    framework's approval agent's, approved and resumed: the loop imports nothing, neither
    the framework nor what the provider's connections and the price table load."""
    agents = [name for name in CHAT_AGENTS if name in CATALOGUE]
    assert "demo.chat" in agents
    programs = {agent: subprocess.Popen(
        [sys.executable, "-m", "tests.first_run_imports", str(tmp_path / f"{agent}.sqlite3"),
         f"{agent},{approval(agent)}"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
        for agent in agents}
    for agent, program in programs.items():
        out, err = program.communicate(timeout=180)
        assert program.returncode == 0, err[-3000:]
        runs = json.loads(out.strip().splitlines()[-1])["runs"]
        assert [(run["agent"], run["end_cause"]) for run in runs] == [
            (agent, "completed")] * 2 + [(approval(agent), "completed")] * 2, runs
        assert [run["approvals"] for run in runs] == [0, 0, 1, 1]
        assert [run["imported_on_the_loop"] for run in runs] == [[]] * 4, agent


def approval(chat_agent: str) -> str:
    """The approval agent shipped beside ``chat_agent``, of its framework."""
    return chat_agent.replace(".chat", ".approval")


@OWN_PROCESS
def test_the_processs_executor_prepares_every_agent_as_it_starts_and_freezes_it(tmp_path):
    """The process's executor (as ``get_executor`` makes it) prepares every agent of the
    catalogue before work arrives and then freezes what it made: a framework agent's first
    run imports nothing on any thread, and the collector's full passes no longer go
    through the framework's modules."""
    program = subprocess.run(
        [sys.executable, "-m", "tests.first_run_imports", str(tmp_path / "db.sqlite3"),
         "pydantic_ai.chat", "prepared"],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert program.returncode == 0, program.stderr[-3000:]
    result = json.loads(program.stdout.strip().splitlines()[-1])
    assert [run["end_cause"] for run in result["runs"]] == ["completed"] * 2, result
    assert [run["imported"] for run in result["runs"]] == [[], []]
    assert result["frozen"] > 100_000  # the frameworks' modules, among the rest


@OWN_PROCESS
def test_the_start_prepares_a_waiting_attempts_agent_first_and_goes_past_a_hung_one(tmp_path):
    """As a process's executor starts, an attempt's agent is prepared before the
    catalogue's others that wait their turn, which then wait for it; one whose preparation
    never returns, an attempt waiting for it, is given ``PREPARE_WAIT`` (3 s here) once,
    and the rest are prepared and frozen without it; it keeps its thread, and the process
    still exits."""
    program = subprocess.run(
        [sys.executable, "-m", "tests.start_preparations", str(tmp_path / "db.sqlite3")],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert program.returncode == 0, program.stderr[-3000:]
    result = json.loads(program.stdout.strip().splitlines()[-1])
    assert result["begun"][0] == "gate", result
    assert sorted(result["begun"][1:3]) == ["hung", "wanted"], result  # as their attempts ask
    assert result["begun"][3:] == ["first", "second"], result
    assert (result["end_cause"], result["output"]) == ("completed", {"ran": "wanted"})
    assert result["frozen"] > 100_000, result  # the hung preparation kept no freeze
    assert program.stderr.count("test.start.hung still preparing after 3 s") == 1
    # What the worker answers awaken_prepared while its start still prepares, and after.
    assert result["asked"][0] == {"prepared": False, "seconds": None}
    assert result["asked"][1]["prepared"] and 3 < result["asked"][1]["seconds"] < 60


def test_a_worker_without_the_processs_executor_says_it_is_not_prepared(monkeypatch):
    """The remote-control command ``awaken_prepared``, before the process's executor
    exists and from one that prepares nothing as it starts (as a test makes one); the
    process's own says so once prepared (the test above)."""
    from runs.runtime import executor as executors
    from runs.workers.readiness import awaken_prepared

    executor = None
    monkeypatch.setattr(executors, "current_executor", lambda: executor)
    assert awaken_prepared(None) == {"prepared": False, "seconds": None}
    executor = SimpleNamespace(prepared_in=None)  # as Executor(prepare_all=False) stays
    assert awaken_prepared(None) == {"prepared": False, "seconds": None}


PREPARING = threading.Event()  # set by test.prepare.slow's preparation once it has begun
PREPARED = threading.Event()  # lets it end
CALLS = {"slow": 0, "failing": 0}


@register
class Slow(Agent):
    """Its preparation waits to be let go, as a large framework's import takes a second."""

    name = "test.prepare.slow"

    @classmethod
    def prepare(cls):
        CALLS["slow"] += 1
        PREPARING.set()
        PREPARED.wait(30)

    async def run(self, ctx):
        return {"prepared": PREPARED.is_set()}


@register
class FailingOnce(Agent):
    """Its first preparation fails."""

    name = "test.prepare.failing_once"

    @classmethod
    def prepare(cls):
        CALLS["failing"] += 1
        if CALLS["failing"] == 1:
            raise ImportError("no module named 'a_framework'")

    async def run(self, ctx):
        return {"ran": True}


@pytest.fixture
def executor():
    from runs.runtime.executor import Executor

    made = Executor(node="preparation", lease_seconds=3600, db_threads=2)
    yield made
    PREPARED.set()
    made.close()


def started(executor, agent: str, input: dict | None = None) -> Run:
    run, _ = domain.run_create(agent=agent, input=input or {}, dispatch=False)
    assert executor.start([run.id]) == 1
    return run


def ended(run: Run, timeout: float = 20) -> Run:
    return wait_until(lambda: (lambda now: now if now.state == RunState.ENDED else None)(
        Run.objects.get(pk=run.id)), timeout, "the run to end")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_slow_preparation_holds_up_only_its_own_agents_attempts(executor):
    """While one agent prepares, another's attempts run and end, and a cancel ends an
    attempt that waits for the preparation. Attempts that wait together share one
    preparation, and once it is done they run."""
    PREPARING.clear()
    PREPARED.clear()
    waiting = [started(executor, Slow.name) for _ in range(3)]
    assert PREPARING.wait(10)
    other = started(executor, "demo.steps", {"steps": 2, "step_seconds": 0})
    assert ended(other).end_cause == "completed"
    cancelled = waiting.pop()
    executor.registry.get(str(cancelled.id)).token.cancel(Why("command"))
    assert ended(cancelled).end_cause == "cancelled"
    assert Run.objects.filter(pk__in=[run.id for run in waiting],
                              state=RunState.RUNNING).count() == 2
    PREPARED.set()
    assert [(run.end_cause, run.output) for run in map(ended, waiting)] == [
        ("completed", {"prepared": True})] * 2
    assert CALLS["slow"] == 1
    assert ended(started(executor, Slow.name)).end_cause == "completed"
    assert CALLS["slow"] == 1  # prepared once in the process


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_failed_preparation_fails_its_attempt_and_the_next_one_prepares_again(executor):
    CALLS["failing"] = 0
    failed = ended(started(executor, FailingOnce.name))
    assert failed.end_cause == "failed" and "no module named 'a_framework'" in failed.error
    assert ended(started(executor, FailingOnce.name)).output == {"ran": True}
    assert CALLS["failing"] == 2
