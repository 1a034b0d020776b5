"""The agent interface's model calls (``ctx.chat``, ``ctx.converse``) and live output, on a
context whose host records what the executor would commit, against the provider stub."""

import asyncio
import copy
import json
import threading
import time

import pytest

from harness.processes import wait_until
from runs.domain.actions import action_digest
from runs.providers import metering
from runs.providers.client import ChatClient, ProviderConfig, ToolCall
from runs.runtime.agent import Context, Interrupted, tool
from runs.runtime.token import CancellationToken, Why
from runs.runtime.tools import Toolbox, parameters_of

# No test here uses the test database: its verdict is the same on either backend.
pytestmark = pytest.mark.one_backend


class Host:
    """The executor's side of the interface, recording instead of committing."""

    def __init__(self, provider, per_second: float = 10):
        self.provider = provider
        self.output_per_second = per_second
        self.pushes: list[tuple[float, dict]] = []
        self.commits: list[dict] = []
        self.activity_log: list[dict] = []

    def publish_output(self, run_id, text):
        self.pushes.append((time.monotonic(), json.loads(text)))

    def activity(self, ctx, entry):
        self.activity_log.append(entry)

    async def fence(self, ctx):  # no request is ever committed here
        pass

    async def before_step(self, ctx):
        ctx.check()

    def before_tool(self, ctx, tool, arguments, pending):
        return action_digest(tool, arguments)  # no loop guard here

    async def commit_step(self, ctx, *, tokens, data):
        self.commits.append({"tokens": tokens, "data": data, "state": copy.deepcopy(ctx.state)})

    async def run_sync_tool(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def call():
            result, failure = None, None
            try:
                result = fn(*args, **kwargs)
            except Exception as error:
                failure = error
            if not loop.is_closed():  # an abandoned tool may outlive its test's loop
                loop.call_soon_threadsafe(_settle, future, result, failure)

        threading.Thread(target=call, daemon=True).start()
        return await asyncio.shield(future)


def _settle(future, result, error):
    if not future.done():
        future.set_exception(error) if error else future.set_result(result)


def attempt(stub_server, work, *, per_second=10, token=None, state=None):
    """Run ``work(ctx, host)`` as an attempt would; returns the host and the result."""
    token = token or CancellationToken()

    async def main():
        client = ChatClient(ProviderConfig(base_url=stub_server.url, model="echo",
                                           max_retries=1))
        host = Host(client, per_second)
        ctx = Context(run_id="r1", generation=2, input={}, state=state, resume=None,
                      token=token, host=host)
        try:
            return host, await work(ctx, host)
        finally:
            await client.aclose()

    return asyncio.run(main())


HELLO = [{"role": "user", "content": "alpha beta gamma"}]


def test_a_chat_counts_the_providers_tokens_and_commits_its_answer_with_the_step(stub_server):
    async def work(ctx, host):
        async with ctx.step():
            reply = await ctx.chat(HELLO)
        return reply

    host, reply = attempt(stub_server, work)
    (commit,) = host.commits
    assert commit["tokens"] == reply.tokens == 3 + 5  # the stub's own usage figures
    (recorded,) = commit["data"]["replies"]
    assert recorded["content"] == "You said: alpha beta gamma"
    assert recorded["usage"] == {"prompt": 3, "completion": 5}
    assert recorded["model"] == "echo" and recorded["tries"] == 1 and recorded["ms"] > 0


def test_live_output_is_throttled_and_adds_up_to_the_answer(stub_server):
    async def work(ctx, host):
        async with ctx.step():
            reply = await ctx.chat(HELLO, model="echo+words=80+pace=0.01")
            pushed_before_commit = len(host.pushes)
        assert len(host.pushes) == pushed_before_commit
        return reply

    host, reply = attempt(stub_server, work, per_second=10)
    pushes = [message for _, message in host.pushes]
    times = [at for at, _ in host.pushes]
    assert len(pushes) >= 3, "the answer was pushed as it streamed, not once at the end"
    # A push a tenth of a second at most; the end of the text goes at once, at the end.
    assert all(b - a >= 0.095 for a, b in zip(times[:-1], times[1:-1], strict=False)), times
    text = ""
    for message in pushes:
        assert message["type"] == "run.output" and "seq" not in message
        assert (message["run_id"], message["generation"], message["call"]) == ("r1", 2, 1)
        assert message["offset"] == len(text)
        text += message["delta"]
    assert text == reply.content


def test_a_large_answer_is_pushed_in_pieces_well_under_a_websocket_message(stub_server):
    async def work(ctx, host):
        async with ctx.step():
            return await ctx.chat(HELLO, model="echo+bytes=900000")

    host, reply = attempt(stub_server, work, per_second=1)
    pushes = [message for _, message in host.pushes]
    assert len(reply.content) == 900000
    assert max(len(json.dumps(message)) for message in pushes) < 256 * 1024
    assert "".join(message["delta"] for message in pushes) == reply.content


def test_no_live_output_when_it_is_turned_off(stub_server):
    async def work(ctx, host):
        return await ctx.chat(HELLO)

    host, reply = attempt(stub_server, work, per_second=0)
    assert reply.content and host.pushes == []


def test_a_cancel_mid_stream_closes_the_connection_and_drops_the_partial_answer(stub_server):
    token = CancellationToken()
    stub = stub_server.stub

    async def work(ctx, host):
        asyncio.get_running_loop().run_in_executor(None, lambda: (
            stub.wait(lambda calls: host.pushes and calls[-1].holding), token.cancel(
                Why("command"))))
        with pytest.raises(Interrupted):
            async with ctx.step():
                await ctx.chat(HELLO, model="echo+hang=3")
        await asyncio.sleep(0)
        return time.monotonic()

    # One push a second: the first chunk goes out at once, the next ones wait, and are
    # dropped by the cancel.
    host, interrupted = attempt(stub_server, work, per_second=1, token=token)
    call = stub.wait(lambda calls: calls[-1].disconnected and calls[-1], what="a close")
    assert call.finished is None
    assert host.commits == []
    assert [message["delta"] for _, message in host.pushes] == ["You "]


def test_a_chat_cancelled_mid_stream_is_recorded_with_its_time_and_the_tokens_received(
        stub_server):
    """The cancelled call is in the run's activity (and so its trace): a model call marked
    cancelled, from its start until the abort, with the tokens (streamed chunks) received
    by then; the step it was for commits nothing."""
    token = CancellationToken()

    async def work(ctx, host):
        metering.CURRENT.set(ctx.meter)  # as the executor does for the attempt's task
        asyncio.get_running_loop().run_in_executor(None, lambda: (
            wait_until(lambda: ctx.meter.received >= 3, 10, "three chunks"),
            token.cancel(Why("command"))))
        started = time.monotonic()
        with pytest.raises(Interrupted):
            async with ctx.step():
                await ctx.chat(HELLO, model="echo+hang=3")
        return time.monotonic() - started

    host, waited = attempt(stub_server, work, token=token)
    assert host.commits == []
    (cut,) = [entry for entry in host.activity_log if entry["kind"] == "model"]
    assert (cut["text"], cut["tokens"]) == ("echo+hang=3", 3)
    assert cut["data"] == {"cancelled": True, "finish_reason": "cancelled", "received": 3}
    assert 0 < cut["ms"] <= waited * 1000


@tool
def search_notes(query: str, limit: int = 2) -> str:
    """Search the notes."""
    return f"notes about {query}"


async def count_words(text: str) -> dict:
    """Count words."""
    return {"words": len(text.split())}


def test_converse_runs_the_tools_the_model_asks_for_and_records_each(stub_server):
    async def work(ctx, host):
        return await ctx.converse(HELLO, tools=[search_notes, count_words])

    host, answer = attempt(stub_server, work)
    assert answer == ("You said: alpha beta gamma From the tools: notes about alpha beta "
                      'gamma | {"words": 3}')
    first, second = host.commits  # one step per round
    tools = {t["call_id"]: t for t in first["data"]["tools"]}  # in the order they ended
    asked = first["data"]["replies"][0]["tool_calls"]
    assert [(tools[call["id"]]["name"], tools[call["id"]]["ok"]) for call in asked] == [
        ("search_notes", True), ("count_words", True)]
    assert all(t["ms"] >= 0 for t in tools.values())
    assert "tools" not in second["data"]
    conversation = second["state"]["conversation"]
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool", "tool",
                                                 "assistant"]


def test_converse_goes_on_from_the_committed_conversation(stub_server):
    done = [*HELLO, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "search_notes",
                                                      "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "from before"}]

    async def work(ctx, host):
        return await ctx.converse(HELLO, tools=[search_notes])

    host, answer = attempt(stub_server, work, state={"conversation": done})
    assert answer.endswith("From the tools: from before")
    assert len(host.commits) == 1


def test_a_failing_or_unknown_tool_sends_its_error_to_the_model(stub_server):
    def broken(text: str) -> str:
        """Always fails."""
        raise RuntimeError("disk on fire")

    async def work(ctx, host):
        async with ctx.step():
            failed = await ctx._tool_call(Toolbox([broken]),
                                          ToolCall("c1", "broken", '{"text": "x"}'))
            unknown = await ctx._tool_call(Toolbox([broken]), ToolCall("c2", "nope", "{}"))
            garbled = await ctx._tool_call(Toolbox([broken]), ToolCall("c3", "broken", "[1"))
        return failed, unknown, garbled

    host, (failed, unknown, garbled) = attempt(stub_server, work)
    assert failed == "error: RuntimeError: disk on fire"
    assert unknown == "error: no tool is named 'nope'"
    assert garbled.startswith("error: ")
    records = host.commits[0]["data"]["tools"]
    assert [(r["call_id"], r["ok"]) for r in records] == [("c1", False), ("c2", False),
                                                          ("c3", False)]


def test_a_blocking_tool_is_abandoned_when_the_attempt_is_cancelled(stub_server):
    release = threading.Event()
    token = CancellationToken()

    def stuck(query: str) -> str:
        """Never answers in time."""
        threading.Timer(0.05, token.cancel, args=(Why("command"),)).start()
        release.wait(30)
        return "too late"

    async def work(ctx, host):
        started = time.monotonic()
        with pytest.raises(Interrupted):
            await ctx.converse(HELLO, tools=[stuck])
        return time.monotonic() - started

    try:
        host, waited = attempt(stub_server, work, token=token)
    finally:
        release.set()
    assert waited < 10 and host.commits == []


def test_a_tools_schema_is_read_from_its_signature():
    def lookup(order: str, count: int, price: float, urgent: bool = False,
               tags: list[str] | None = None, *rest, **extra) -> str:
        """Look an order up."""

    assert parameters_of(lookup) == {"type": "object", "properties": {
        "order": {"type": "string"}, "count": {"type": "integer"},
        "price": {"type": "number"}, "urgent": {"type": "boolean"},
        "tags": {"type": "array"}}, "required": ["order", "count", "price"]}
    spec = tool(lookup).spec()["function"]
    assert (spec["name"], spec["description"]) == ("lookup", "Look an order up.")


def test_two_tools_of_one_name_are_refused():
    with pytest.raises(ValueError, match="same name"):
        Toolbox([search_notes, tool(count_words, name="search_notes")])


def test_live_output_reaches_only_the_sockets_of_its_run():
    from runs.changes.outbox import Outbox
    from runs.changes.publishing import publish_output
    from runs.changes.stream import stream

    async def body():
        own, every, other = [], [], []

        async def nothing():
            pass

        def outbox(into):
            async def send(text):
                into.append(text)
            return Outbox(send, nothing)

        run_id, other_id = "0" * 32, "1" * 32
        followers = [(outbox(own), run_id), (outbox(every), None), (outbox(other), other_id)]
        for box, follows in followers:
            await stream.join(box, follows)
        try:
            with stream.watch(run_id) as watch:
                publish_output(run_id=run_id, text='{"type": "run.output"}')
                deadline = time.monotonic() + 5
                while not own and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert watch.next(timeout=0.2) is None  # a waiting call wants commits only
        finally:
            for box, follows in followers:
                stream.leave(box, follows)
                box.close()
        return own, every, other

    own, every, other = asyncio.run(body())
    assert own == ['{"type": "run.output"}'] and every == [] and other == []
