"""REST endpoints: authenticate, look up, validate, call the domain once, answer committed state."""

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework import status
from rest_framework.authentication import SessionAuthentication
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from runs import domain
from runs.api import listing, waiting
from runs.api import serializers as s
from runs.api.permissions import IsOperator, IsViewer
from runs.domain import activity, limits, selectors
from runs.domain.errors import InvalidRequest, NotActive
from runs.domain.representation import activity_data, event_data, run_data
from runs.models import RunState

# 429: a token check refused while its address or key prefix is locked (runs.domain.throttle);
# 413: a body over AWAKEN_MAX_BODY_BYTES.
ERRORS = {code: s.ErrorSerializer for code in (400, 401, 403, 404, 409, 413, 429)}


def query(serializer_class, request) -> dict:
    """The validated query string; blank values count as absent."""
    data = {key: value for key, value in request.query_params.items() if value != ""}
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def page(request, results: list, cursor: str | None) -> Response:
    """A page of a list: its ``results``, and under ``next`` the same request's URL with
    ``cursor`` in place of its own, or None on the last page."""
    next_url = None
    if cursor:
        params = request.query_params.copy()
        params["cursor"] = cursor
        next_url = request.build_absolute_uri(f"{request.path}?{params.urlencode()}")
    return Response({"results": results, "next": next_url})


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
    @extend_schema(operation_id="runs_list", parameters=[listing.RunSearchQuery],
                   responses={200: s.RunPageSerializer, **ERRORS})
    def get(self, request):
        """Runs matching the filters, newest first unless sorted otherwise."""
        filters = listing.run_search(request)
        limit, cursor, sort = filters.pop("limit"), filters.pop("cursor", None), filters.pop("sort")
        runs, next_cursor = selectors.run_list(
            filters=filters, cursor=cursor, limit=limit, sort=sort,
            payload_bytes=settings.AWAKEN_LIST_PAYLOAD_BYTES)
        return page(request, [run_data(run) for run in runs], next_cursor)

    @extend_schema(
        request=s.RunCreateSerializer,
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
        responses={201: s.RunSerializer, 200: s.RunSerializer, **ERRORS},
    )
    def post(self, request):
        """Create a run; replaying an Idempotency-Key returns the first run (200)."""
        data = validated(s.RunCreateSerializer, request)
        key = request.headers.get("Idempotency-Key") or None
        if key is not None:
            if len(key) > 200:
                raise InvalidRequest("Idempotency-Key is longer than 200 characters.")
            limits.check_text(key, "Idempotency-Key")
        run, created = domain.run_create(
            agent=data["agent"], input=data.get("input"), thread_id=data.get("thread_id"),
            parent_id=data.get("parent_id"), budget=data.get("budget"),
            start_after=data.get("start_after"), created_by=request.user,
            idempotency_key=key, source=source(request),
        )
        if not created:  # a replayed key: answer with the run as it is now
            run = selectors.run_get(run.id)
        return Response(run_data(run),
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class RunBatchView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(operation_id="runs_batch_create", request=s.RunBatchCreateSerializer,
                   responses={201: s.RunBatchSerializer, **ERRORS})
    def post(self, request):
        """Create up to 500 runs in one transaction, all or none, in the order given."""
        if request.headers.get("Idempotency-Key"):
            raise InvalidRequest("Idempotency-Key is not supported on a batch; retry a "
                                 "failed batch only after checking which runs exist.")
        data = validated(s.RunBatchCreateSerializer, request)
        runs = domain.runs_create(runs=[dict(item) for item in data["runs"]],
                                    created_by=request.user, source=source(request))
        return Response({"results": [run_data(run) for run in runs]},
                        status=status.HTTP_201_CREATED)


SOURCE_HEADER = "X-Awaken-Source"  # what the command line (runs.client) says it is


def source(request) -> str:
    """Browser calls (session auth) record source ``ui``; scripts record ``api``, or ``cli``
    when they say so with ``X-Awaken-Source: cli`` (the ``awaken`` command line does)."""
    if isinstance(request.successful_authenticator, SessionAuthentication):
        return "ui"
    return "cli" if request.headers.get(SOURCE_HEADER, "").strip() == "cli" else "api"


class RunDetailView(APIView):
    @extend_schema(operation_id="runs_retrieve", responses={200: s.RunSerializer, **ERRORS})
    def get(self, request, run_id):
        return Response(run_data(selectors.run_get(run_id)))


class RunEventsView(APIView):
    @extend_schema(operation_id="runs_events_list", parameters=[s.EventsQuery],
                   responses={200: s.EventPageSerializer, **ERRORS})
    def get(self, request, run_id):
        run = selectors.run_get(run_id)
        events = selectors.run_events(run=run, **query(s.EventsQuery, request))
        return Response({"results": [event_data(event) for event in events]})


class RunActivityView(APIView):
    @extend_schema(operation_id="runs_activity_list", parameters=[s.ActivityQuery],
                   responses={200: s.ActivityPageSerializer, **ERRORS})
    def get(self, request, run_id):
        """The run's activity log in order, as its page shows it: log lines, progress,
        steps, model and tool calls with durations; page on with after = the last seq."""
        run = selectors.run_get(run_id)
        asked = query(s.ActivityQuery, request)
        entries = activity.run_activity(run_id=run.id, after=asked["after"],
                                        limit=asked["limit"])
        return Response({"results": [activity_data(entry) for entry in entries]})


class EventListView(APIView):
    @extend_schema(operation_id="events_list", parameters=[s.EventFeedQuery],
                   responses={200: s.EventPageSerializer, **ERRORS})
    def get(self, request):
        """Committed events of all runs in seq order; page on with after = the last seq."""
        events = selectors.events_after(**query(s.EventFeedQuery, request))
        return Response({"results": [event_data(event) for event in events]})


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
        wait = query(s.WaitQuery, request)["wait"]
        with waiting.watching(run_id) as watch:
            result = self.request_end(run_id, data, actor=actor(request),
                                      source=source(request))
            return control_response(waiting.wait_for_end(result.run, wait, watch))


class RunCancelView(EndRequestView):
    serializer_class = s.CancelSerializer

    @extend_schema(request=s.CancelSerializer, parameters=[s.WaitQuery],
                   responses={200: s.RunSerializer, 202: s.RunSerializer, **ERRORS})
    def post(self, request, run_id):
        """Cancel: 200 once ended (whatever cause committed first), 202 if still pending."""
        return super().post(request, run_id)

    def request_end(self, run_id, data, **who):
        return domain.run_cancel(run_id=run_id, reason=data.get("reason"), **who)


class RunStopView(EndRequestView):
    serializer_class = s.StopSerializer

    @extend_schema(request=s.StopSerializer, parameters=[s.WaitQuery],
                   responses={200: s.RunSerializer, 202: s.RunSerializer, **ERRORS})
    def post(self, request, run_id):
        """Stop with a reason (stop_code ``operator``): 200 once ended, 202 if still pending."""
        return super().post(request, run_id)

    def request_end(self, run_id, data, **who):
        return domain.run_stop(run_id=run_id, reason=data["reason"], **who)


class RunResumeView(ControlView):
    @extend_schema(request=s.ResumeSerializer, responses={200: s.RunSerializer, **ERRORS})
    def post(self, request, run_id):
        """Wake an awaiting run with its open ticket."""
        run_id = selectors.parse_run_id(run_id)
        data = validated(s.ResumeSerializer, request)
        run = domain.run_resume(run_id=run_id, ticket_id=data["ticket"],
                                input=data.get("input"), actor=actor(request),
                                source=source(request))
        return Response(run_data(run))  # as its transaction committed it


class RunPauseView(ControlView):
    @extend_schema(request=None, parameters=[s.WaitQuery],
                   responses={200: s.RunSerializer, 202: s.RunSerializer,
                              409: s.NotActiveSerializer, **ERRORS})
    def post(self, request, run_id):
        """Pause a running run at its next step boundary: 200 once awaiting with a ticket,
        202 while it is still running; 409 ``not_active`` if it was not running when asked
        or ended before reaching a boundary (``run`` is the committed run)."""
        validated(s.NoBodySerializer, request)
        wait = query(s.WaitQuery, request)["wait"]
        run_id = selectors.parse_run_id(run_id)
        with waiting.watching(run_id) as watch:
            try:
                run = domain.run_pause(run_id=run_id, actor=actor(request),
                                       source=source(request))
            except NotActive as error:
                return not_active(error.message, selectors.run_get(run_id))
            run = waiting.wait_until_not_running(run, wait, watch)
        if run["state"] == RunState.ENDED:
            return not_active("The run ended before it reached a step boundary.", run)
        code = status.HTTP_202_ACCEPTED if run["state"] == RunState.RUNNING else status.HTTP_200_OK
        return Response(run, status=code)


def not_active(detail: str, run) -> Response:
    """409 ``not_active`` with the run as committed."""
    run = run if isinstance(run, dict) else run_data(run)
    return Response({"code": NotActive.code, "detail": detail, "run": run},
                    status=status.HTTP_409_CONFLICT)


class RunDeliverView(ControlView):
    @extend_schema(request=s.DeliverSerializer, responses={200: s.DeliveredSerializer, **ERRORS})
    def post(self, request, run_id):
        """Live only: no intent is written and nothing durable happens if it is NotActive."""
        selectors.run_get(run_id)  # 404 before 400
        data = validated(s.DeliverSerializer, request)
        run = domain.run_live_command(run_id=run_id, command=data["command"],
                                 message=data.get("message"), actor=actor(request),
                                 source=source(request))
        return Response({"delivered": True, "generation": run.generation})


class SchemaView(SpectacularAPIView):
    """The OpenAPI document (YAML or JSON, as asked); its errors are JSON like the API's."""

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return response
