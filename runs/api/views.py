"""REST endpoints: authenticate, look up, validate, call one service, answer committed state."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.authentication import SessionAuthentication
from rest_framework.response import Response
from rest_framework.views import APIView

from runs import live, selectors, services
from runs.api import serializers as s
from runs.api import waiting
from runs.api.permissions import IsOperator, IsViewer
from runs.models import EndCause, RunState
from runs.services.errors import InvalidRequest

ERRORS = {code: s.ErrorSerializer for code in (400, 401, 403, 404, 409)}
WAIT = OpenApiParameter("wait", OpenApiTypes.NUMBER, description="Seconds to wait for the "
                        "committed result (default 5, at most 30, 0 = do not wait).")


def int_param(request, name: str, default: int, *, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"{name} must be a whole number.", field=name) from None
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be between {low} and {high}.", field=name)
    return value


def wait_param(request) -> float:
    raw = request.query_params.get("wait")
    if raw in (None, ""):
        return 5.0
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequest("wait must be a number of seconds.", field="wait") from None
    if not 0 <= value <= 30:
        raise InvalidRequest("wait must be between 0 and 30 seconds.", field="wait")
    return value


def validated(serializer_class, request):
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def actor(request) -> str:
    return request.user.get_username()


def control_response(run: dict) -> Response:
    """200 with the committed terminal state, or 202 while the request is still pending."""
    code = status.HTTP_200_OK if run["state"] == RunState.ENDED else status.HTTP_202_ACCEPTED
    return Response(run, status=code)


class OperatorPostMixin:
    def get_permissions(self):
        if self.request.method == "POST":
            return [IsOperator()]
        return [IsViewer()]


class RunListView(OperatorPostMixin, APIView):
    FILTERS = {
        "state": RunState.values,
        "end_cause": EndCause.values,
    }

    @extend_schema(
        operation_id="runs_list",
        parameters=[
            OpenApiParameter("state", enum=RunState.values),
            OpenApiParameter("end_cause", enum=EndCause.values),
            OpenApiParameter("agent", str),
            OpenApiParameter("thread_id", str),
            OpenApiParameter("parent_id", OpenApiTypes.UUID),
            OpenApiParameter("cursor", str),
            OpenApiParameter("limit", int, description="Page size, 1 to 500 (default 50)."),
        ],
        responses={200: s.RunPageSerializer, **ERRORS},
    )
    def get(self, request):
        """Runs, newest first."""
        filters = {}
        for name in ("state", "end_cause", "agent", "thread_id", "parent_id"):
            value = request.query_params.get(name)
            if value in (None, ""):
                continue
            if name in self.FILTERS and value not in self.FILTERS[name]:
                raise InvalidRequest(f"{name} must be one of {', '.join(self.FILTERS[name])}.",
                                     field=name)
            if name == "parent_id":
                try:
                    value = selectors.parse_run_id(value)
                except services.RunNotFound:
                    raise InvalidRequest("parent_id must be a UUID.", field=name) from None
            filters[name] = value
        limit = int_param(request, "limit", 50, low=1, high=500)
        page, cursor = selectors.run_list(
            filters=filters, cursor=request.query_params.get("cursor"), limit=limit)
        next_url = None
        if cursor:
            query = request.query_params.copy()
            query["cursor"] = cursor
            next_url = request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
        return Response({"results": s.RunSerializer(page, many=True).data, "next": next_url})

    @extend_schema(
        request=s.RunCreateSerializer,
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
        responses={201: s.RunSerializer, 200: s.RunSerializer, **ERRORS},
    )
    def post(self, request):
        """Create a run; replaying an Idempotency-Key returns the first run (200)."""
        data = validated(s.RunCreateSerializer, request)
        key = request.headers.get("Idempotency-Key") or None
        if key is not None and len(key) > 200:
            raise InvalidRequest("Idempotency-Key is longer than 200 characters.")
        run, created = services.run_create(
            agent=data["agent"], input=data.get("input"), thread_id=data.get("thread_id"),
            parent_id=data.get("parent_id"), budget=data.get("budget"),
            start_after=data.get("start_after"), created_by=request.user,
            idempotency_key=key, source=source(request),
        )
        run = selectors.run_get(run.id)
        return Response(s.RunSerializer(run).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


def source(request) -> str:
    """Browser calls (session auth) record source ``ui``; scripts record ``api``."""
    return "ui" if isinstance(request.successful_authenticator, SessionAuthentication) else "api"


class RunDetailView(APIView):
    @extend_schema(operation_id="runs_retrieve", responses={200: s.RunSerializer, **ERRORS})
    def get(self, request, run_id):
        return Response(s.RunSerializer(selectors.run_get(run_id)).data)


class RunEventsView(APIView):
    @extend_schema(operation_id="runs_events_list", parameters=[OpenApiParameter("after", int)],
                   responses={200: s.EventPageSerializer, **ERRORS})
    def get(self, request, run_id):
        run = selectors.run_get(run_id)
        after = int_param(request, "after", 0, low=0, high=2**62)
        events = selectors.run_events(run=run, after=after)
        return Response({"results": s.EventSerializer(events, many=True).data})


class EventListView(APIView):
    @extend_schema(operation_id="events_list",
                   parameters=[OpenApiParameter("after", int), OpenApiParameter("limit", int)],
                   responses={200: s.EventPageSerializer, **ERRORS})
    def get(self, request):
        """Committed events of all runs in seq order; page on with after = the last seq."""
        after = int_param(request, "after", 0, low=0, high=2**62)
        limit = int_param(request, "limit", 100, low=1, high=1000)
        events = selectors.events_after(after=after, limit=limit)
        return Response({"results": s.EventSerializer(events, many=True).data})


class ControlView(APIView):
    permission_classes = [IsOperator]


class EndRequestView(ControlView):
    """Cancel and stop: the request is recorded, then answered with committed state."""

    serializer_class = None

    def request_end(self, run_id, data, *, actor: str, source: str):
        raise NotImplementedError

    def post(self, request, run_id):
        run_id = selectors.parse_run_id(run_id)
        data = validated(self.serializer_class, request)
        wait = wait_param(request)
        result = self.request_end(run_id, data, actor=actor(request), source=source(request))
        return control_response(waiting.wait_for_end(result.run.id, wait))


class RunCancelView(EndRequestView):
    serializer_class = s.CancelSerializer

    @extend_schema(request=s.CancelSerializer, parameters=[WAIT],
                   responses={200: s.RunSerializer, 202: s.RunSerializer, **ERRORS})
    def post(self, request, run_id):
        """Cancel: 200 once ended (whatever cause committed first), 202 if still pending."""
        return super().post(request, run_id)

    def request_end(self, run_id, data, **who):
        return services.run_cancel(run_id=run_id, reason=data.get("reason"), **who)


class RunStopView(EndRequestView):
    serializer_class = s.StopSerializer

    @extend_schema(request=s.StopSerializer, parameters=[WAIT],
                   responses={200: s.RunSerializer, 202: s.RunSerializer, **ERRORS})
    def post(self, request, run_id):
        """Stop with a reason (stop_code ``operator``): 200 once ended, 202 if still pending."""
        return super().post(request, run_id)

    def request_end(self, run_id, data, **who):
        return services.run_stop(run_id=run_id, reason=data["reason"], **who)


class RunResumeView(ControlView):
    @extend_schema(request=s.ResumeSerializer, responses={200: s.RunSerializer, **ERRORS})
    def post(self, request, run_id):
        """Wake an awaiting run with its open ticket."""
        run_id = selectors.parse_run_id(run_id)
        data = validated(s.ResumeSerializer, request)
        services.run_resume(run_id=run_id, ticket_id=data["ticket"], input=data.get("input"),
                            actor=actor(request), source=source(request))
        return Response(s.RunSerializer(selectors.run_get(run_id)).data)



class RunPauseView(ControlView):
    @extend_schema(request=None, parameters=[WAIT],
                   responses={200: s.RunSerializer, 202: s.RunSerializer, **ERRORS})
    def post(self, request, run_id):
        """Pause a running run at its next step boundary: 200 once awaiting with a ticket."""
        run = selectors.run_get(run_id)
        wait = wait_param(request)
        live.deliver(run_id=run.id, generation=run.generation, owner=run.owner,
                     command="pause", actor=actor(request), source=source(request))
        run = waiting.wait_until_not_running(run.id, wait)
        code = status.HTTP_202_ACCEPTED if run["state"] == RunState.RUNNING else status.HTTP_200_OK
        return Response(run, status=code)


class RunDeliverView(ControlView):
    @extend_schema(request=s.DeliverSerializer, responses={200: s.DeliveredSerializer, **ERRORS})
    def post(self, request, run_id):
        """Live only: no intent is written and nothing durable happens if it is NotActive."""
        run = selectors.run_get(run_id)
        data = validated(s.DeliverSerializer, request)
        generation = live.deliver(run_id=run.id, generation=run.generation, owner=run.owner,
                                  command=data["command"], actor=actor(request),
                                  source=source(request))
        return Response({"delivered": True, "generation": generation})
