"""Traces for OpenTelemetry (runs/telemetry.py): off unless the OTEL_* settings ask, and on,
spans that follow the GenAI semantic conventions, from the REST request that created a run
to its attempt in the worker, its model and tool calls and the controls it took."""

import os
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from harness.processes import ROOT, wait_until
from runs import telemetry
from runs.models import Run
from runs.runtime.executor import Executor
from runs.runtime.registry import Entry, Registry
from runs.runtime.token import CancellationToken
from tests.conftest import client_for, make_user

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


def test_traces_are_on_only_when_the_standard_settings_name_an_exporter():
    assert not telemetry.wanted({})
    assert telemetry.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert telemetry.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318"})
    assert telemetry.wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not telemetry.wanted({"OTEL_TRACES_EXPORTER": "none",
                                 "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert not telemetry.wanted({"OTEL_SDK_DISABLED": "true",
                                 "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})


def test_without_the_settings_nothing_of_opentelemetry_is_imported():
    """A site and a worker without OTEL_* settings: the request middleware, a run's trace
    context and an attempt's trace are all no-ops, and no OpenTelemetry module is loaded."""
    code = """
import sys
import django
django.setup()
from django.test import Client
import runs.runtime.executor, runs.workers.commands, runs.api.views
from runs import telemetry
assert Client(HTTP_HOST="localhost").get("/accounts/login/").status_code == 200
assert telemetry.traceparent() == ""
assert telemetry.attempt(run_id="r", generation=1, agent="a", thread_id="t",
                         traceparent=None) is telemetry.NO_ATTEMPT
loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
assert not loaded, loaded
"""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env.update(DJANGO_SETTINGS_MODULE="tests.settings", SECRET_KEY="x")
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_settings_set_up_an_exporter():
    """OTEL_TRACES_EXPORTER=console: an attempt's span is exported as the SDK prints it;
    with an OTLP endpoint, the exporter of the protocol asked for is made."""
    code = """
import django
django.setup()
from opentelemetry import trace
from runs import telemetry
assert telemetry.enabled()
telemetry.attempt(run_id="r1", generation=1, agent="demo.steps", thread_id="t1",
                  traceparent=None).end("completed")
trace.get_tracer_provider().force_flush()
"""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env.update(DJANGO_SETTINGS_MODULE="tests.settings", SECRET_KEY="x",
               OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="awaken-tests")
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"name": "invoke_agent demo.steps"' in done.stdout
    assert '"service.name": "awaken-tests"' in done.stdout
    # An exporter awaken-site does not make: said once in the log, and no traces.
    env["OTEL_TRACES_EXPORTER"] = "zipkin"
    done = subprocess.run([sys.executable, "-c", (
        "from runs import telemetry; assert not telemetry.enabled(); "
        "assert telemetry.traceparent() == ''")], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "No traces: OTEL_TRACES_EXPORTER='zipkin'" in done.stderr
    for protocol, module in (("grpc", "grpc"), ("http/protobuf", "http")):
        env.pop("OTEL_TRACES_EXPORTER")
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
                   OTEL_EXPORTER_OTLP_PROTOCOL=protocol)
        done = subprocess.run([sys.executable, "-c", (
            "from runs import telemetry; "
            "print(type(telemetry._exporter()).__module__)")], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert f"opentelemetry.exporter.otlp.proto.{module}.trace_exporter" in done.stdout
        env["OTEL_TRACES_EXPORTER"] = "otlp"


@pytest.fixture
def spans():
    """Traces on, to the SDK's in-memory exporter, for this test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.use(provider)
    yield exporter
    telemetry.use(None)
    provider.shutdown()


@pytest.fixture
def no_dispatch(monkeypatch):
    # The runs are started by hand, if at all; none goes to the broker.
    monkeypatch.setattr("runs.workers.dispatch.runs_queued", lambda **kwargs: None)


@pytest.fixture
def executor(no_dispatch, stub_server, settings):
    settings.AWAKEN_PROVIDER_BASE_URL = stub_server.url
    settings.AWAKEN_PROVIDER_MODEL = "echo"
    settings.AWAKEN_PROVIDER_MAX_RETRIES = 0
    made = Executor(node="telemetry", lease_seconds=3600, db_threads=2)
    yield made
    made.close()


def ended(run_id) -> Run:
    return wait_until(lambda: (lambda run: run if run.state == "ended" else None)(
        Run.objects.get(pk=run_id)), 20, "the run to end")


def named(exporter, prefix: str) -> list:
    return [span for span in exporter.get_finished_spans() if span.name.startswith(prefix)]


def create(client, agent: str, input: dict) -> str:
    response = client.post("/api/runs/", {"agent": agent, "input": input}, format="json",
                           HTTP_TRACEPARENT=TRACEPARENT)
    assert response.status_code == 201, response.content
    return response.json()["id"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_run_is_traced_from_its_request_through_its_model_and_tool_calls(spans, executor):
    client = client_for(make_user("olga", "operator"))
    run_id = create(client, "demo.research", {"question": "alpha beta", "model": "echo"})
    assert Run.objects.get(pk=run_id).traceparent.startswith(f"00-{TRACE_ID}-")
    assert executor.start([run_id]) == 1
    assert ended(run_id).end_cause == "completed"
    wait_until(lambda: named(spans, "invoke_agent"), 10, "the attempt's span to end")

    (request,) = named(spans, "POST /api/runs/")
    assert request.context.trace_id == int(TRACE_ID, 16)
    assert request.parent.span_id == int(CLIENT_SPAN, 16)  # the client's traceparent
    assert request.attributes["http.response.status_code"] == 201

    (agent,) = named(spans, "invoke_agent")
    assert agent.name == "invoke_agent demo.research"
    assert agent.context.trace_id == int(TRACE_ID, 16)
    assert agent.parent.span_id == request.context.span_id  # carried into the worker
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.agent.name"] == "demo.research"
    assert agent.attributes["awaken.run.id"] == run_id
    assert agent.attributes["awaken.attempt.outcome"] == "completed"

    chats = named(spans, "chat ")
    assert len(chats) == 2  # one per round: asking for the tools, then answering
    for chat in chats:
        assert chat.name == "chat echo"
        assert chat.parent.span_id == agent.context.span_id
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.provider.name"] == "openai"
        assert chat.attributes["gen_ai.request.model"] == "echo"
        assert chat.attributes["gen_ai.usage.input_tokens"] > 0
        assert chat.attributes["gen_ai.usage.output_tokens"] > 0
        assert chat.start_time <= chat.end_time
    tools = {span.attributes["gen_ai.tool.name"]: span for span in named(spans, "execute_tool")}
    assert set(tools) == {"search_notes", "count_words"}
    for name, tool in tools.items():
        assert tool.name == f"execute_tool {name}"
        assert tool.parent.span_id == agent.context.span_id
        assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
        assert tool.attributes["gen_ai.tool.call.id"]
        assert agent.start_time <= tool.start_time <= tool.end_time <= agent.end_time


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_child_run_is_traced_under_its_parents_attempt(spans, executor):
    client = client_for(make_user("olga", "operator"))
    run_id = create(client, "demo.parent", {"children": 2, "child_agent": "demo.steps",
                                            "child_input": {"steps": 1, "step_seconds": 0}})
    assert executor.start([run_id]) == 1
    assert ended(run_id).end_cause == "completed"
    agents = wait_until(lambda: (lambda found: found if len(found) == 3 else None)(
        named(spans, "invoke_agent")), 10, "three attempts' spans")
    (parent,) = [span for span in agents if span.attributes["awaken.run.id"] == run_id]
    children = [span for span in agents if span is not parent]
    assert {span.name for span in children} == {"invoke_agent demo.steps"}
    assert all(span.parent.span_id == parent.context.span_id for span in children)
    assert all(span.context.trace_id == int(TRACE_ID, 16) for span in children)
    stored = Run.objects.filter(parent_id=run_id).values_list("traceparent", flat=True)
    assert set(stored) == {parent_traceparent(parent)}


def parent_traceparent(span) -> str:
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_cancel_is_an_event_on_the_attempts_span_naming_actor_source_and_reason(
        spans, executor):
    client = client_for(make_user("olga", "operator"))
    run_id = create(client, "demo.hang", {})
    assert executor.start([run_id]) == 1
    wait_until(lambda: executor.registry.get(run_id), 10, "the attempt to start")
    response = client.post(f"/api/runs/{run_id}/cancel/", {"reason": "enough"}, format="json")
    assert response.status_code in (200, 202), response.content
    run = Run.objects.get(pk=run_id)
    # The live signal, as the worker's command receiver applies it.
    assert executor.registry.apply(run_id, run.generation, "cancel", actor="olga",
                                   source="api")
    assert ended(run_id).end_cause == "cancelled"
    (agent,) = wait_until(lambda: named(spans, "invoke_agent"), 10, "the attempt's span")
    (event,) = [event for event in agent.events if event.name == "cancel"]
    assert dict(event.attributes) == {
        "awaken.control.action": "cancel", "awaken.control.actor": "olga",
        "awaken.control.source": "api", "awaken.control.reason": "enough"}
    assert agent.attributes["awaken.attempt.outcome"] == "interrupted"


@pytest.mark.django_db(transaction=True)  # the span is made once the stop commits
def test_a_control_no_attempt_takes_is_a_span_of_its_own_in_the_runs_trace(spans, no_dispatch):
    client = client_for(make_user("olga", "operator"))
    run_id = create(client, "demo.steps", {})  # queued: no attempt is live
    response = client.post(f"/api/runs/{run_id}/stop/", {"reason": "not today"},
                           format="json", HTTP_TRACEPARENT=TRACEPARENT)
    assert response.status_code == 200, response.content
    (stop,) = named(spans, "stop run")
    (created,) = [span for span in named(spans, "POST /api/runs/") if span.name.endswith("/")
                  and "<" not in span.name]
    (asked,) = named(spans, "POST /api/runs/<")
    assert stop.context.trace_id == int(TRACE_ID, 16)
    assert stop.parent.span_id == created.context.span_id  # in the run's trace
    assert [link.context.span_id for link in stop.links] == [asked.context.span_id]
    (event,) = stop.events
    assert (event.name, event.attributes["awaken.control.actor"],
            event.attributes["awaken.control.source"],
            event.attributes["awaken.control.reason"]) == ("stop", "olga", "api", "not today")


def test_live_commands_an_attempt_takes_are_events_on_its_span(spans):
    registry = Registry()
    entry = Entry("r1", 1, CancellationToken())
    entry.trace = telemetry.attempt(run_id="r1", generation=1, agent="demo.inbox",
                                    thread_id="t1", traceparent=TRACEPARENT)
    registry.register(entry)
    assert registry.apply("r1", 1, "message", message={"n": 1}, actor="olga", source="cli")
    assert registry.apply("r1", 1, "wake", actor="olga", source="api")
    assert registry.apply("r1", 1, "pause", actor="pat", source="ui")
    assert registry.apply("r1", 1, "cancel", actor="pat", source="ui")
    entry.trace.end("interrupted")
    (agent,) = spans.get_finished_spans()
    assert agent.parent.span_id == int(CLIENT_SPAN, 16)
    # The cancel's event names its request, once the attempt ends (Executor._interrupted).
    assert [(event.name, event.attributes["awaken.control.actor"],
             event.attributes["awaken.control.source"]) for event in agent.events] == [
        ("deliver", "olga", "cli"), ("wake", "olga", "api"), ("pause", "pat", "ui")]
