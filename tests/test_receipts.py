"""Stop receipts (SPEC §7.14): what an attempt did after a cancel or stop of its run was
asked, and the host's fence that refuses every tool the agent tries to start after it."""

import asyncio
import threading
from datetime import UTC, datetime

import pytest
from django.test import Client

from runs import domain
from runs.domain.actions import action_digest
from runs.domain.receipts import Trace, receipt
from runs.models import Run
from runs.runtime.agent import Context, Interrupted
from runs.runtime.executor import Executor
from runs.runtime.registry import Entry
from runs.runtime.token import CancellationToken
from tests.conftest import make_user
from tests.factories import running_run


def test_a_receipt_counts_from_the_request_or_the_attempts_own_stop_whichever_is_first():
    asked = datetime.fromtimestamp(100.0, UTC)
    trace = Trace(connections=[(90.0, 95.0), (98.0, 100.25), (101.0, None)],
                  chunk_times=[97.0, 99.0, 100.1, 100.2],
                  tools_in_flight=[{"tool": "send", "digest": "d"}], tools_refused=2)
    written = receipt(trace, asked)
    assert written == {"provider_closed_at": "1970-01-01T00:01:40.250000Z",
                       "tokens_after_request": 2,
                       "tool_calls_in_flight": [{"tool": "send", "digest": "d"}],
                       "tool_calls_refused": 2}
    # A policy the attempt applied itself is "asked" when it commits: the token's cancel
    # (the attempt's own decision) is the start instead.
    early = Trace(connections=trace.connections, chunk_times=trace.chunk_times,
                  stopped_at=98.5)
    assert receipt(early, asked)["tokens_after_request"] == 3
    assert receipt(Trace(), asked)["provider_closed_at"] is None


@pytest.mark.postgres  # an executor's threads: SQLite's shared cache locks their tables
@pytest.mark.django_db(transaction=True)
def test_a_tool_started_after_a_committed_cancel_never_runs_and_is_on_the_receipt():
    """The cancel is committed and its live signal never comes (no worker took it): the
    token is not cancelled, yet the host's fence reads the committed request and refuses
    the tool; the blocking tool in flight before it stays on the receipt."""
    executor = Executor(node="receipts", lease_seconds=3600, db_threads=1)
    run, generation = running_run()
    token = CancellationToken()
    view = domain.selectors.attempt_view(run=run, generation=generation)
    host = executor.host_for(Entry(str(run.id), generation, token, loop=executor.loop), view)
    ctx = Context(run_id=str(run.id), generation=generation, input={}, state={}, resume=None,
                  token=token, host=host)
    ran, started, release = [], threading.Event(), threading.Event()

    def send_email(to: str, body: str):
        ran.append(to)
        return "sent"

    def slow_lookup(order: str):
        started.set()
        release.wait(30)

    async def attempt():
        first = asyncio.ensure_future(ctx.tool(slow_lookup, order="A-1"))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        await executor.worker_loop.db(domain.run_cancel, run_id=run.id, actor="olga",
                                      source="api")
        assert not token.cancelled  # committed, not delivered
        with pytest.raises(Interrupted):
            await ctx.tool(send_email, to="a@example.com", body="hi")
        with pytest.raises(Interrupted):
            await first
        await executor._interrupted(str(run.id), generation, token.why, view,
                                    trace=await executor._trace(ctx))

    try:
        asyncio.run_coroutine_threadsafe(attempt(), executor.loop).result(20)
    finally:
        release.set()
        executor.close()
    assert ran == []
    run = Run.objects.select_related("control").get(pk=run.id)
    assert (run.state, run.end_cause) == ("ended", "cancelled")
    assert run.control.receipt == {
        "provider_closed_at": None, "tokens_after_request": 0,
        "tool_calls_in_flight": [{"tool": "slow_lookup",
                                  "digest": action_digest("slow_lookup", {"order": "A-1"})}],
        "tool_calls_refused": 1}
    page = Client()
    page.force_login(make_user("vera", "viewer"))
    shown = page.get(f"/runs/{run.id}/").content.decode()
    assert "Stop receipt:" in shown and "slow_lookup" in shown
    text = Client().get("/metrics").content.decode()
    assert "awaken_stop_tool_calls_refused_total 1.0" in text
    assert "awaken_stop_tool_calls_in_flight_total 1.0" in text
