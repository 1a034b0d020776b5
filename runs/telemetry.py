"""Traces of runs for OpenTelemetry, when an operator asks for them.

Off unless the standard OpenTelemetry settings name an exporter: ``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (OTLP, over ``OTEL_EXPORTER_OTLP_PROTOCOL``:
``http/protobuf``, the default, or ``grpc``), or ``OTEL_TRACES_EXPORTER`` (``otlp`` or
``console``; ``none`` is off). ``OTEL_SDK_DISABLED=true`` turns it off whatever else is set.
The SDK reads the rest of its settings itself (``OTEL_SERVICE_NAME``, headers, timeouts,
sampling). Off, nothing of OpenTelemetry is imported and every call here does nothing.

What is traced follows the GenAI semantic conventions:

* the REST request that creates a run is a server span, continued from the client's
  ``traceparent`` header; the run keeps its W3C trace context (``traceparent()``, stored
  with the run by the domain);
* each attempt is an ``invoke_agent {agent}`` span, a child of that context, in the worker
  (a child run the agent starts keeps the attempt's context, ``within``);
* each model call of the attempt is a ``chat {model}`` span, each tool call an
  ``execute_tool {tool}`` span, both children of the attempt's: made from the run's activity
  entries (``Attempt.activity``), so every agent and framework adapter is traced alike;
* each control action (cancel, stop, pause, resume, deliver, wake) is an event on the
  span of the attempt it reached, or on a span of its own when no attempt is live
  (``control``), with its actor, source and reason.

This module imports nothing of the project: every layer may call it.
"""

import logging
import os
import threading
from datetime import datetime

log = logging.getLogger(__name__)

TRACER_NAME = "awaken-site"
PROVIDER = "openai"  # gen_ai.provider.name: the provider client speaks OpenAI's chat API

_lock = threading.Lock()
_tracer = None  # the tracer once on; None while off
_decided = False  # whether the settings were read


def wanted(environ=os.environ) -> bool:
    """Whether the standard OpenTelemetry settings in ``environ`` ask for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
                or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip())


def _tracer_now():
    """The tracer, set up from the environment on first use; None while off."""
    global _tracer, _decided
    if _decided:
        return _tracer
    with _lock:
        if not _decided:
            if wanted():
                try:
                    _tracer = _tracer_from(_provider_from_environment())
                except ImportError:
                    log.error("The OTEL_* settings ask for traces, but OpenTelemetry is not "
                              "installed (pip install 'awaken-site[otel]'): no traces.")
                except ValueError as error:
                    log.error("No traces: %s", error)
            _decided = True
    return _tracer


def enabled() -> bool:
    return _tracer_now() is not None


def use(provider) -> None:
    """Trace to ``provider`` (an SDK ``TracerProvider``) from now on; None: off again.
    For a test, with the SDK's in-memory exporter."""
    global _tracer, _decided
    with _lock:
        _tracer = None if provider is None else _tracer_from(provider)
        _decided = True


def _tracer_from(provider):
    return provider.get_tracer(TRACER_NAME)


def _provider_from_environment():
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": TRACER_NAME}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(_exporter()))
    trace.set_tracer_provider(provider)  # for any other instrumentation of the process
    return provider


def _exporter():
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if exporter != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter!r}: awaken-site exports to otlp "
                         "or console")
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    if protocol.strip().lower() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


# --- trace context -------------------------------------------------------------------------

def traceparent() -> str:
    """The W3C ``traceparent`` of the current span ("" when off or outside any span)."""
    if _tracer_now() is None:
        return ""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent", "")


def _context_of(traceparent_text: str | None):
    """The OpenTelemetry context a stored ``traceparent`` names (the root one if none)."""
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not traceparent_text:
        return Context()
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent_text})


def within(traceparent_text: str, fn, /, **kwargs):
    """``fn(**kwargs)`` with the span a ``traceparent`` names as the current one (a thread
    of its own has none): a run it creates is in that trace."""
    if not traceparent_text or _tracer_now() is None:
        return fn(**kwargs)
    from opentelemetry import context

    token = context.attach(_context_of(traceparent_text))
    try:
        return fn(**kwargs)
    finally:
        context.detach(token)


def _ns(at: datetime | None) -> int | None:
    return None if at is None else int(at.timestamp() * 1_000_000_000)


class Middleware:
    """Django middleware: each request is a server span, continued from the client's
    ``traceparent`` header, current while the view runs (a run it creates keeps it)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        tracer = _tracer_now()
        if tracer is None:
            return self.get_response(request)
        from opentelemetry import context, trace

        parent = _context_of(request.headers.get("traceparent"))
        span = tracer.start_span(request.method, context=parent, kind=trace.SpanKind.SERVER,
                                 attributes={"http.request.method": request.method,
                                             "url.path": request.path})
        token = context.attach(trace.set_span_in_context(span, parent))
        try:
            response = self.get_response(request)
        except BaseException as error:
            span.record_exception(error)
            span.set_status(trace.StatusCode.ERROR, type(error).__name__)
            raise
        else:
            match = getattr(request, "resolver_match", None)
            if match is not None and match.route:
                route = "/" + match.route.lstrip("^").rstrip("$")
                span.update_name(f"{request.method} {route}")
                span.set_attribute("http.route", route)
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 500:
                span.set_status(trace.StatusCode.ERROR)
            return response
        finally:
            context.detach(token)
            span.end()


# --- attempts -------------------------------------------------------------------------------

def _control_attributes(action: str, actor, source, reason) -> dict:
    attributes = {"awaken.control.action": str(action),
                  "awaken.control.actor": str(actor or ""),
                  "awaken.control.source": str(source or "")}
    if reason:
        attributes["awaken.control.reason"] = str(reason)
    return attributes


class NoAttempt:
    """An attempt's trace while tracing is off: every call does nothing."""

    traceparent = ""  # the W3C trace context of its span

    def activity(self, entry: dict) -> None:
        pass

    def control(self, action: str, *, actor=None, source=None, reason=None,
                at: datetime | None = None) -> None:
        pass

    def end(self, outcome: str, error: str | None = None) -> None:
        pass


NO_ATTEMPT = NoAttempt()


class Attempt(NoAttempt):
    """The ``invoke_agent`` span of one attempt, open from its start to its end."""

    def __init__(self, tracer, *, run_id: str, generation: int, agent: str, thread_id: str,
                 traceparent: str | None, server: str | None):
        from opentelemetry import trace

        self._trace = trace
        self._tracer = tracer
        self._server = server
        self._ended = False
        self._lock = threading.Lock()  # controls come from the worker's main thread
        self.span = tracer.start_span(
            f"invoke_agent {agent}", context=_context_of(traceparent),
            kind=trace.SpanKind.INTERNAL, attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent,
                "gen_ai.provider.name": PROVIDER, "gen_ai.conversation.id": thread_id,
                "awaken.run.id": run_id, "awaken.attempt.generation": generation})
        self._context = trace.set_span_in_context(self.span)
        context = self.span.get_span_context()
        self.traceparent = (f"00-{context.trace_id:032x}-{context.span_id:016x}-"
                            f"{int(context.trace_flags):02x}")

    def activity(self, entry: dict) -> None:
        """A span for an activity entry of the attempt that is a model call (``chat``) or a
        tool call (``execute_tool``), timed as the entry is (``at``, ``ms``)."""
        kind = entry.get("kind")
        if kind not in ("model", "tool"):
            return
        data = entry.get("data") or {}
        start = _ns(entry.get("at"))
        end = None if start is None else start + int(float(entry.get("ms") or 0) * 1_000_000)
        name = str(entry.get("text") or kind)
        trace = self._trace
        if kind == "model":
            attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": PROVIDER,
                          "gen_ai.request.model": name, "gen_ai.response.model": name}
            if self._server:
                attributes["server.address"] = self._server
            for key, attribute in (("input_tokens", "gen_ai.usage.input_tokens"),
                                   ("output_tokens", "gen_ai.usage.output_tokens")):
                if data.get(key) is not None:
                    attributes[attribute] = int(data[key])
            if data.get("finish_reason"):
                attributes["gen_ai.response.finish_reasons"] = [str(data["finish_reason"])]
            if data.get("framework"):
                attributes["awaken.framework"] = str(data["framework"])
            span = self._tracer.start_span(f"chat {name}", context=self._context,
                                           kind=trace.SpanKind.CLIENT, attributes=attributes,
                                           start_time=start)
        else:
            attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                          "gen_ai.tool.type": "function"}
            if data.get("call_id"):
                attributes["gen_ai.tool.call.id"] = str(data["call_id"])
            if data.get("framework"):
                attributes["awaken.framework"] = str(data["framework"])
            span = self._tracer.start_span(f"execute_tool {name}", context=self._context,
                                           kind=trace.SpanKind.INTERNAL,
                                           attributes=attributes, start_time=start)
            if data.get("ok") is False:
                error = str(data.get("error") or ("refused" if data.get("refused")
                                                  else "failed"))
                span.set_attribute("error.type", error.split(":", 1)[0])
                span.set_status(trace.StatusCode.ERROR, error)
        span.end(end_time=end)

    def control(self, action: str, *, actor=None, source=None, reason=None,
                at: datetime | None = None) -> None:
        """A control action the attempt took (at ``at``, or now): an event on its span."""
        with self._lock:
            if not self._ended:
                self.span.add_event(str(action),
                                    _control_attributes(action, actor, source, reason),
                                    timestamp=_ns(at))

    def end(self, outcome: str, error: str | None = None) -> None:
        """Close the span: ``outcome`` is how the attempt ended (completed, cancelled,
        stopped, paused, failed, fenced...), ``error`` what failed it."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self.span.set_attribute("awaken.attempt.outcome", outcome)
        if error is not None:
            self.span.set_attribute("error.type", error.split(":", 1)[0])
            self.span.set_status(self._trace.StatusCode.ERROR, error)
        self.span.end()


def attempt(*, run_id, generation: int, agent: str, thread_id: str,
            traceparent: str | None, server: str | None = None) -> NoAttempt:
    """The trace of an attempt starting now, a child of the run's stored ``traceparent``;
    a no-op one while off."""
    tracer = _tracer_now()
    if tracer is None:
        return NO_ATTEMPT
    return Attempt(tracer, run_id=str(run_id), generation=generation, agent=agent,
                   thread_id=thread_id, traceparent=traceparent, server=server)


def control(*, run_id, traceparent: str | None, action: str, actor=None, source=None,
            reason=None) -> None:
    """A control action no live attempt took (a queued or awaiting run cancelled, stopped
    or resumed): a span of its own in the run's trace, with the action as its event, linked
    to the span of the request that asked for it."""
    tracer = _tracer_now()
    if tracer is None:
        return
    from opentelemetry import trace

    action = str(action)
    asking = trace.get_current_span().get_span_context()  # the request that asked, if any
    span = tracer.start_span(f"{action} run", context=_context_of(traceparent),
                             attributes={"awaken.run.id": str(run_id),
                                         "awaken.control.action": action},
                             links=[trace.Link(asking)] if asking.is_valid else None)
    span.add_event(action, _control_attributes(action, actor, source, reason))
    span.end()
