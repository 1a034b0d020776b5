"""Agents that call a model provider, run by ``manage.py serve`` against the provider stub
of the test session, all over real HTTP: the stub sees what a provider would see.

The site's worker streams from the stub; the tests watch a run's socket as a script would
(``/ws/runs/<id>/``) and read the committed state from the REST API.
"""

import json
import threading
import time
from contextlib import ExitStack
from datetime import datetime

import pytest
from websockets.sync.client import connect

from harness.processes import wait_until
from runs import domain
from runs.models import Event
from tests.conftest import PROVIDER_KEY, client_for, make_user

# What a cancel may take, request sent to connection closed at the stub, on a loaded
# 2-core machine. Measured: about 15 ms (README, "cancel -> provider connection closed").
CLOSE_BOUND = 2.0


def create(site, agent, input=None, **extra) -> dict:
    status, run = site.call("POST", "/api/runs/", {"agent": agent, "input": input or {},
                                                   **extra})
    assert status == 201, run
    return run


def run_of(site, run_id) -> dict:
    return site.call("GET", f"/api/runs/{run_id}/")[1]


def ended(site, run_id, timeout=20) -> dict:
    return wait_until(lambda: (lambda run: run if run["state"] == "ended" else None)(
        run_of(site, run_id)), timeout, f"run {run_id} to end")


def events(site, run_id) -> list[dict]:
    return site.call("GET", f"/api/runs/{run_id}/events/")[1]["results"]


def calls_of(server, model):
    return [call for call in server.stub.calls if call.model == model]


class Watcher:
    """A script's socket on one run, keeping every message it is sent, in order."""

    def __init__(self, site, run_id):
        self._stack = ExitStack()
        self.socket = self._stack.enter_context(connect(
            f"ws://127.0.0.1:{site.port}/ws/runs/{run_id}/",
            additional_headers={"Authorization": f"Token {site.token}"}, open_timeout=10))
        self.messages: list[dict] = []
        self._open = True
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        self.wait(lambda messages: any(m["type"] == "snapshot" for m in messages))

    def _read(self):
        while self._open:
            try:
                self.messages.append(json.loads(self.socket.recv(timeout=0.2)))
            except TimeoutError:
                continue
            except Exception:
                return

    def wait(self, condition, timeout=20):
        return wait_until(lambda: condition(list(self.messages)), timeout, "socket messages")

    def outputs(self) -> list[dict]:
        return [m for m in self.messages if m["type"] == "run.output"]

    def close(self):
        self._open = False
        self._thread.join(2)
        self._stack.close()


@pytest.fixture
def watch(agent_site):
    opened = []

    def make(run_id) -> Watcher:
        opened.append(Watcher(agent_site, run_id))
        return opened[-1]

    yield make
    for watcher in opened:
        watcher.close()


def test_a_chat_streams_to_the_runs_socket_and_commits_only_its_answer(agent_site,
                                                                      provider_stub, watch):
    model = "echo+words=60+pace=0.02+hang=0"  # holds before its first chunk
    run = create(agent_site, "demo.chat", {"prompt": "stream me", "model": model})
    watcher = watch(run["id"])
    call = provider_stub.stub.wait(lambda calls: next(
        (c for c in calls if c.model == model and c.holding), None), what="the call")
    provider_stub.stub.release()  # the socket is there: let the answer stream
    done = ended(agent_site, run["id"])
    assert done["end_cause"] == "completed"
    kinds = [event["kind"] for event in events(agent_site, run["id"])]
    assert kinds == ["created", "started", "step", "ended"]  # nothing stored per token
    step = next(e for e in events(agent_site, run["id"]) if e["kind"] == "step")
    (reply,) = step["data"]["replies"]
    assert reply["content"] == done["output"]["replies"][0] and len(reply["content"].split()) == 60

    messages = watcher.wait(lambda messages: any(
        m["type"] == "run.changed" and m["event"]["kind"] == "ended" for m in messages)
        and messages)
    pushed = [m for m in messages if m["type"] == "run.output"]
    text = ""
    for message in pushed:
        assert message["offset"] == len(text) and "seq" not in message and "run" not in message
        text += message["delta"]
    assert text == reply["content"]
    # Throttled: a tenth of a second at least between two pushes (the end of the text goes
    # at once), all of them after the first chunk left the stub and before the step
    # committed. On the wall clock, the stub's being this process's monotonic one.
    first_chunk = call.first_chunk + (time.time() - time.monotonic())
    window = datetime.fromisoformat(step["at"]).timestamp() - first_chunk
    assert 2 <= len(pushed) <= window * 10 + 2, (len(pushed), window)
    # On the run's socket the text comes first, then the committed step that holds it.
    order = [m["event"]["kind"] if m["type"] == "run.changed" else m["type"]
             for m in messages if m["type"] != "snapshot"]
    assert order.index("step") > max(i for i, kind in enumerate(order) if kind == "run.output")


def test_a_cancel_mid_stream_closes_the_providers_connection_at_once(agent_site,
                                                                    provider_stub, watch):
    model = "echo+hang=0+hang=3"  # holds before its first chunk, then after its third
    run = create(agent_site, "demo.chat", {"prompt": "never finished", "model": model})
    watcher = watch(run["id"])
    call = provider_stub.stub.wait(lambda calls: next(
        (c for c in calls if c.model == model and c.holding), None), what="the call")
    provider_stub.stub.release()  # the socket is there: let the first three chunks go
    provider_stub.stub.wait(lambda calls: call.holding and call.chunks == 3,
                            what="a hanging stream")
    # They have reached the worker (on a busy machine it can read them later than the
    # stub sent them): what comes after the request is none.
    watcher.wait(lambda messages: "".join(
        m["delta"] for m in messages if m["type"] == "run.output").strip() == "You said: never")
    sent = time.monotonic()
    status, body = agent_site.call("POST", f"/api/runs/{run['id']}/cancel/", {})
    assert status == 200 and body["end_cause"] == "cancelled"
    provider_stub.stub.wait(lambda calls: call.disconnected, what="the connection to close")
    closed_after = call.disconnected - sent
    print(f"cancel -> provider connection closed: {closed_after * 1000:.1f} ms")
    assert closed_after < CLOSE_BOUND
    assert call.finished is None
    # Nothing of the partial answer was committed.
    assert [e["kind"] for e in events(agent_site, run["id"])] == [
        "created", "started", "cancel_requested", "ended"]
    assert body["output"] is None and body["usage"]["tokens"] == 0
    # The stop receipt: the connection closed, no chunk after the request, no tool.
    receipt = body["control"]["receipt"]
    closed = datetime.fromisoformat(receipt["provider_closed_at"])
    assert closed >= datetime.fromisoformat(body["control"]["requested_at"])
    assert receipt["tokens_after_request"] == 0
    assert receipt["tool_calls_in_flight"] == [] and receipt["tool_calls_refused"] == 0


def test_a_retry_cancelled_in_its_backoff_ends_the_run_and_never_goes_out(agent_site,
                                                                          provider_stub):
    model = "echo+429+retry-after=30"
    run = create(agent_site, "demo.chat", {"prompt": "rate limited", "model": model})
    provider_stub.stub.wait(lambda calls: any(c.model == model and c.finished for c in calls),
                       what="the 429")
    started = time.monotonic()
    status, body = agent_site.call("POST", f"/api/runs/{run['id']}/cancel/", {})
    assert status == 200 and body["end_cause"] == "cancelled"
    assert time.monotonic() - started < 10  # not after the 30 s the provider asked for
    assert [c.status for c in calls_of(provider_stub, model)] == [429]


def test_the_providers_usage_figures_stop_the_run_at_its_token_budget(agent_site,
                                                                      provider_stub):
    model = "echo+budget"
    run = create(agent_site, "demo.chat", {
        "prompts": ["one two three", "four five", "six seven", "eight", "nine", "ten"],
        "system": "Be brief.", "model": model}, budget={"max_tokens": 40})
    done = ended(agent_site, run["id"])
    assert (done["end_cause"], done["stop_code"]) == ("stopped", "max_tokens")
    steps = [e for e in events(agent_site, run["id"]) if e["kind"] == "step"]
    per_step = [sum(r["usage"]["prompt"] + r["usage"]["completion"]
                    for r in step["data"]["replies"]) for step in steps]
    assert [step["data"]["tokens"] for step in steps] == per_step
    assert done["usage"]["tokens"] == sum(per_step) >= 40
    assert sum(per_step[:-1]) < 40  # the budget was not reached before the last step
    assert len(calls_of(provider_stub, model)) == len(steps) < 6


def test_a_late_chunk_after_the_terminal_commit_is_never_shown_or_stored(agent_site,
                                                                         provider_stub,
                                                                         watch):
    model = "echo+hang=0+hang=2"  # holds before its first chunk, then after two
    run = create(agent_site, "demo.chat", {"prompt": "zebra quartz", "model": model})
    watcher = watch(run["id"])
    provider_stub.stub.wait(lambda calls: next(
        (c for c in calls if c.model == model and c.holding), None), what="the call")
    provider_stub.stub.release()
    # The call that goes on (if the client ever asked again, the newest one), held again
    # after its second chunk.
    call = provider_stub.stub.wait(lambda calls: next(
        (c for c in reversed(calls) if c.model == model and c.holding and c.chunks == 2),
        None), what="two chunks")
    watcher.wait(lambda messages: "said:" in "".join(
        m.get("delta", "") for m in messages if m["type"] == "run.output"))
    status, body = agent_site.call("POST", f"/api/runs/{run['id']}/cancel/", {})
    assert status == 200 and body["end_cause"] == "cancelled"
    provider_stub.stub.wait(lambda calls: call.disconnected, what="the connection to close")
    provider_stub.stub.release()  # the provider sends on as if nothing happened
    provider_stub.stub.wait(lambda calls: call.late_chunks, what="the late chunk")
    ended_seen = watcher.wait(lambda messages: next(
        (i for i, m in enumerate(messages)
         if m["type"] == "run.changed" and m["run"]["state"] == "ended"), None))
    shown = "".join(m.get("delta", "") for m in watcher.messages if m["type"] == "run.output")
    assert shown == "You said: "  # what came before the cancel, and nothing after
    assert all(m["type"] != "run.output" for m in watcher.messages[ended_seen:])
    stored = json.dumps([events(agent_site, run["id"]), run_of(agent_site, run["id"])])
    assert "said:" not in stored  # no reply was committed, partial or whole


def test_research_calls_its_tools_and_records_each_with_its_duration(agent_site):
    run = create(agent_site, "demo.research", {"question": "provider cancel"})
    done = ended(agent_site, run["id"])
    assert done["end_cause"] == "completed"
    assert "closes its HTTP connection at once" in done["output"]["answer"]
    first, second = [e for e in events(agent_site, run["id"]) if e["kind"] == "step"]
    tools = first["data"]["tools"]
    assert sorted(t["name"] for t in tools) == ["count_words", "search_notes"]
    assert all(t["ok"] and t["ms"] >= 0 for t in tools)
    asked = {call["id"] for call in first["data"]["replies"][0]["tool_calls"]}
    assert {t["call_id"] for t in tools} == asked
    assert second["data"]["replies"][0]["finish_reason"] == "stop"


def test_a_cancel_abandons_a_blocking_tool_of_the_loop(agent_site, provider_stub):
    model = "echo+blocking-tool"  # an unknown flag: only names the calls of this test
    run = create(agent_site, "demo.research", {"tool_seconds": 3600, "model": model})
    provider_stub.stub.wait(lambda calls: any(c.model == model and c.finished for c in calls),
                       what="the model to ask for the tools")
    status, body = agent_site.call("POST", f"/api/runs/{run['id']}/cancel/", {})
    assert status == 200 and body["end_cause"] == "cancelled"
    assert len(calls_of(provider_stub, model)) == 1  # the loop went no further


def test_the_key_and_the_providers_address_are_in_no_event_error_or_log(agent_site,
                                                                        provider_stub):
    run = create(agent_site, "demo.chat", {"prompt": "key?", "model": "echo+401"})
    done = ended(agent_site, run["id"])
    assert done["end_cause"] == "failed" and "401" in done["error"]
    assert "[redacted]" in done["error"]
    address = f"127.0.0.1:{provider_stub.port}"
    for text in (json.dumps(done), json.dumps(events(agent_site, run["id"])),
                 agent_site.log()):
        assert PROVIDER_KEY not in text and address not in text


def test_an_installed_packages_agents_run_through_its_entry_point(agent_site):
    summary = create(agent_site, "example.summarize", {"text": "a package of its own"})
    stats = create(agent_site, "example.text_stats", {"text": "count these four words"})
    assert ended(agent_site, summary["id"])["output"] == {
        "summary": "You said: a package of its own"}
    answer = ended(agent_site, stats["id"])["output"]["answer"]
    assert answer.endswith("From the tools: 4 | count")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_on_a_worker_process_a_cancel_mid_stream_closes_the_connection(spare_worker,
                                                                       provider_stub):
    """The production path: a ``celery worker`` on PostgreSQL, the cancel delivered by
    Celery's remote control over Redis."""
    worker = spare_worker(private=True, extra_env={
        "AWAKEN_PROVIDER_BASE_URL": provider_stub.url, "AWAKEN_PROVIDER_API_KEY": PROVIDER_KEY})
    model = "echo+hang=2+on-a-worker"
    run, _ = domain.run_create(agent="demo.chat", input={"prompt": "hi", "model": model},
                               dispatch=False)
    worker.take(run.id)
    call = provider_stub.stub.wait(lambda calls: next(
        (c for c in calls if c.model == model and c.holding), None), what="a hanging stream")
    api = client_for(make_user("olga", "operator"))
    sent = time.monotonic()
    response = api.post(f"/api/runs/{run.id}/cancel/", {}, format="json")
    assert response.status_code == 200 and response.json()["end_cause"] == "cancelled"
    provider_stub.stub.wait(lambda calls: call.disconnected, what="the connection to close")
    assert call.disconnected - sent < CLOSE_BOUND and call.finished is None
    assert list(Event.objects.filter(run_id=run.id).values_list("kind", flat=True)) == [
        "created", "started", "cancel_requested", "ended"]
