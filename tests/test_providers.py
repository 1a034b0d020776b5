"""The provider client (runs/providers/client.py) against the provider stub, over real HTTP:
streaming, usage, tool calls, retries, timeouts, cancellation and secrets."""

import asyncio
import logging
import os
import sys
import time

import httpx
import pytest

from harness.processes import Process, free_port, wait_until
from runs.providers.client import ChatClient, ProviderConfig, ProviderError
from runs.providers.stub import Behaviour

# No test here uses the test database: its verdict is the same on either backend.
pytestmark = pytest.mark.one_backend

KEY = "sk-test-0123456789abcdef"
HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search.",
                                           "parameters": {"type": "object", "properties": {
                                               "query": {"type": "string"},
                                               "limit": {"type": "integer"}},
                                               "required": ["query", "limit"]}}}


def client_of(server, **config) -> ChatClient:
    return ChatClient(ProviderConfig(**{"base_url": server.url, "api_key": KEY,
                                        "model": "echo", "max_retries": 2, **config}))


def run(client: ChatClient, work):
    """Run ``work(client)`` on a loop of its own, closing the client after it."""
    async def main():
        try:
            return await work(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_a_streamed_answer_arrives_piece_by_piece_with_the_providers_usage(stub_server):
    pieces = []
    reply = run(client_of(stub_server), lambda client: client.chat(HELLO, on_delta=pieces.append))
    assert pieces == ["You ", "said: ", "hi ", "there"]
    assert reply.content == "You said: hi there" and reply.finish_reason == "stop"
    # The stub counts words: four in the prompt, four in the answer.
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.tokens) == (4, 4, 8)
    assert reply.tries == 1
    (call,) = stub_server.stub.calls
    assert call.stream and call.authorized and call.finished and call.disconnected is None


def test_a_whole_answer_has_the_same_content_and_usage(stub_server):
    reply = run(client_of(stub_server), lambda client: client.chat(HELLO, stream=False))
    assert (reply.content, reply.tokens) == ("You said: hi there", 8)
    assert not stub_server.stub.calls[0].stream


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_tool_calls_are_put_back_together(stub_server, stream):
    reply = run(client_of(stub_server), lambda client: client.chat(
        [{"role": "user", "content": "cancel latency"}], tools=[SEARCH], stream=stream))
    (call,) = reply.tool_calls
    assert call.name == "search" and call.id
    assert call.parsed() == {"query": "cancel latency", "limit": 3}
    assert reply.finish_reason == "tool_calls"
    assert reply.message["tool_calls"][0]["function"]["arguments"] == call.arguments


@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_failed_try_is_retried_after_the_providers_retry_after(stub_server, status):
    retries = []
    reply = run(client_of(stub_server), lambda client: client.chat(
        HELLO, model=f"echo+{status}+retry-after=0.05",
        on_retry=lambda tries, delay: retries.append((tries, delay))))
    assert reply.content == "You said: hi there" and reply.tries == 2
    assert retries == [(1, 0.05)]
    assert [call.status for call in stub_server.stub.calls] == [status, 200]


def test_retries_give_up_after_the_configured_number(stub_server):
    with pytest.raises(ProviderError) as raised:
        run(client_of(stub_server, max_retries=2), lambda client: client.chat(
            HELLO, model="echo+500+fail=5+retry-after=0"))
    assert raised.value.status == 500
    assert "failed 3 time(s)" in str(raised.value)
    assert len(stub_server.stub.calls) == 3


def test_a_refusal_is_not_retried_and_names_no_secret(stub_server):
    with pytest.raises(ProviderError) as raised:
        run(client_of(stub_server), lambda client: client.chat(HELLO, model="echo+401"))
    message = str(raised.value)
    assert raised.value.status == 401 and "401" in message
    assert KEY not in message and stub_server.url not in message and "[redacted]" in message
    assert len(stub_server.stub.calls) == 1


def test_neither_key_nor_address_reaches_the_logs(stub_server, caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ProviderError):
        run(client_of(stub_server, max_retries=1), lambda client: client.chat(
            HELLO, model="echo+500+fail=5+retry-after=0"))
    run(client_of(stub_server), lambda client: client.chat(HELLO))
    assert caplog.records  # the capture works: asyncio and others logged at DEBUG
    assert KEY not in caplog.text and f"127.0.0.1:{stub_server.port}" not in caplog.text


def test_each_try_has_a_deadline(stub_server):
    started = time.monotonic()
    with pytest.raises(ProviderError, match="no answer within 0.2 s"):
        run(client_of(stub_server, max_retries=0), lambda client: client.chat(
            HELLO, model="echo+hang", timeout=0.2))
    assert time.monotonic() - started < 5
    (call,) = stub_server.stub.calls
    stub_server.stub.wait(lambda calls: calls[0].disconnected, what="the connection to close")


def wait_for(condition, timeout=10.0):
    async def poll():
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.002)
    return poll()


def test_a_cancelled_stream_closes_its_connection_at_once(stub_server):
    stub = stub_server.stub

    async def work(client):
        task = asyncio.ensure_future(client.chat(HELLO, model="echo+hang=2"))
        await wait_for(lambda: stub.calls and stub.calls[-1].chunks >= 2)
        cancelled = time.monotonic()
        task.cancel()
        await wait_for(lambda: stub.calls[-1].disconnected is not None)
        with pytest.raises(asyncio.CancelledError):
            await task
        return stub.calls[-1].disconnected - cancelled

    closed_after = run(client_of(stub_server), work)
    # Measured at the stub, on this machine's shared cores: about 1 ms.
    assert closed_after < 1.0
    assert stub.calls[-1].finished is None


def test_a_retry_cancelled_in_its_backoff_never_goes_out(stub_server):
    stub = stub_server.stub

    async def work(client):
        retrying = asyncio.Event()
        task = asyncio.ensure_future(client.chat(
            HELLO, model="echo+429+retry-after=30",
            on_retry=lambda tries, delay: retrying.set()))
        await asyncio.wait_for(retrying.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert run(client_of(stub_server), work) == []  # nothing left to send the retry
    assert [call.status for call in stub.calls] == [429]


def test_no_provider_configured_is_a_clear_error():
    client = ChatClient(ProviderConfig(base_url="", model="echo"))
    with pytest.raises(ProviderError, match="AWAKEN_PROVIDER_BASE_URL"):
        asyncio.run(client.chat(HELLO))


@pytest.mark.parametrize("model, expected", [
    ("canned", Behaviour(reply="canned")),
    ("echo+hang=3+pace=0.5", Behaviour(hang_at=(3,), pace=0.5)),
    ("echo+hang+hang=4", Behaviour(hang_at=(1, 4))),
    ("echo+429+fail=2+retry-after=1", Behaviour(fail_status=429, fail_times=2,
                                                retry_after="1")),
    ("gpt-anything", Behaviour()),
])
def test_the_stub_reads_its_behaviour_from_the_model_name(model, expected):
    assert Behaviour.of(model) == expected


def test_the_stub_refuses_a_malformed_request(stub_server):
    response = httpx.post(f"{stub_server.url}/chat/completions", content=b"{not json",
                          timeout=5)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"


def test_the_provider_stub_command_serves_the_stub_alone():
    port = free_port()
    with Process([sys.executable, "manage.py", "provider_stub", "--port", str(port),
                  "--pace", "0"], name="provider-stub", env=dict(os.environ)) as process:
        url = f"http://127.0.0.1:{port}/v1"

        def answers():
            try:
                return httpx.get(f"{url}/models", timeout=1).status_code == 200
            except httpx.TransportError:
                return not process.running() and "exited"

        assert wait_until(answers, 30, "the stub to serve") is True, process.output()
        client = ChatClient(ProviderConfig(base_url=url, model="canned"))
        reply = asyncio.run(_once(client, [{"role": "user", "content": "Hello!"}]))
    assert reply.content == "Hello! I am the provider stub of awaken-site, answering offline."


async def _once(client, messages):
    try:
        return await client.chat(messages)
    finally:
        await client.aclose()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_reply_past_the_cap_is_cut_there_and_its_connection_closed(stub_server, stream):
    """A 20 MB answer: the client reads no more than AWAKEN_MAX_REPLY_BYTES of it, closes
    the connection (the provider stops generating) and fails the call, without retrying."""
    from runs.providers.client import ReplyTooLarge

    stub = stub_server.stub
    pieces = []
    with pytest.raises(ReplyTooLarge, match="larger than 1048576 bytes") as raised:
        run(client_of(stub_server, max_reply_bytes=1024 * 1024),
            lambda client: client.chat(HELLO, model="echo+bytes=20000000", stream=stream,
                                       on_delta=pieces.append))
    assert raised.value.code == "reply_too_large"
    assert len(stub.calls) == 1  # not tried again
    assert sum(len(piece) for piece in pieces) <= 1024 * 1024
    if stream:  # (a whole answer is one write: the stub has sent it before it can see)
        wait_until(lambda: stub.calls[0].disconnected is not None, 10, "the stub to see it go")
        assert stub.calls[0].finished is None
        # It stopped sending long before the end (1,221 chunks): how far it got before it
        # saw the close depends on the machine's load (64 fill the cap).
        assert stub.calls[0].chunks < 1221 // 2


def test_a_reply_within_the_cap_is_read_whole(stub_server):
    reply = run(client_of(stub_server, max_reply_bytes=1024 * 1024),
                lambda client: client.chat(HELLO, model="echo+bytes=200000"))
    assert len(reply.content) == 200000
