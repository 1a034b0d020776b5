"""The operations console's calls: run a run again, and the overview's figures."""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from runs import domain
from runs.api import serializers as s
from runs.api.permissions import IsOperator
from runs.api.views import ERRORS, actor, query, source, validated
from runs.domain import overview, selectors
from runs.domain.errors import InvalidRequest
from runs.domain.overview import MAX_WINDOW, MIN_WINDOW
from runs.domain.representation import run_data, worker_data
from runs.models import AppliedVia


class RunRerunView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        operation_id="runs_rerun", request=None,
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
        responses={201: s.RunSerializer, 200: s.RunSerializer, **ERRORS})
    def post(self, request, run_id):
        """Run again: a new run with the same agent, input, budget and thread, whose
        ``rerun_of`` names this one (201); replaying an Idempotency-Key returns it (200)."""
        validated(s.NoBodySerializer, request)
        key = request.headers.get("Idempotency-Key") or None
        if key is not None and len(key) > 200:
            raise InvalidRequest("Idempotency-Key is longer than 200 characters.")
        run, created = domain.run_rerun(run_id=run_id, created_by=request.user,
                                        idempotency_key=key, source=source(request))
        if not created:
            run = selectors.run_get(run.id)
        return Response(run_data(run),
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class OverviewQuery(serializers.Serializer):
    window = s.QueryInteger(
        required=False, min_value=MIN_WINDOW, max_value=MAX_WINDOW,
        help_text=f"Seconds to look back ({MIN_WINDOW} to {MAX_WINDOW}, 3600 by default): "
                  "minutes up to three hours, coarser buckets beyond.")
    since = s.OffsetDateTimeField(
        required=False, help_text="Instead of a window: the range's start (at most 7 days "
                                  "before its end).")
    until = s.OffsetDateTimeField(
        required=False, help_text="The range's end (now by default; a later one is now).")


class StopPathSerializer(serializers.Serializer):
    path = serializers.ChoiceField(choices=AppliedVia.values)
    count = serializers.IntegerField()
    sum = serializers.FloatField(help_text="Seconds, all requests of the path together.")
    buckets = serializers.ListField(
        child=serializers.ListField(child=serializers.JSONField(), min_length=2, max_length=2),
        help_text='Cumulative counts by upper bound in seconds: [["0.005", n], ..., '
                  '["+Inf", count]].')


class PointSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="Start of the bucket.")
    started = serializers.IntegerField()
    ended = serializers.IntegerField()


class LivePointSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="Start of the bucket; the last point of a range "
                                             "that ends now is now.")
    queued = serializers.IntegerField(allow_null=True)
    running = serializers.IntegerField(allow_null=True)
    awaiting = serializers.IntegerField(allow_null=True)


class AgentStopSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    mean = serializers.FloatField(allow_null=True, help_text="Seconds.")
    max = serializers.FloatField(allow_null=True, help_text="Seconds, the slowest.")


class AgentFiguresSerializer(serializers.Serializer):
    agent = serializers.CharField()
    live = serializers.DictField(child=serializers.IntegerField(),
                                 help_text="Its live runs by state, now.")
    ended = serializers.DictField(child=serializers.IntegerField(),
                                  help_text="Its runs ended in the range, by end cause.")
    failure_rate = serializers.FloatField(allow_null=True)
    time_to_stop = AgentStopSerializer(
        help_text="Its cancel and stop requests applied in the range.")


class PercentilesSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Runs ended in the window.")
    p50 = serializers.FloatField(allow_null=True)
    p95 = serializers.FloatField(allow_null=True)
    p99 = serializers.FloatField(allow_null=True)


class OverviewSerializer(serializers.Serializer):
    window = serializers.IntegerField()
    bucket = serializers.IntegerField(help_text="Seconds per point of the series.")
    since = serializers.DateTimeField(help_text="Start of the first bucket.")
    until = serializers.DateTimeField()
    runs = serializers.DictField(child=serializers.IntegerField(),
                                 help_text="Live runs by state, now.")
    ended = serializers.DictField(child=serializers.IntegerField(),
                                  help_text="Runs ended in the window, by end cause.")
    failure_rate = serializers.FloatField(
        allow_null=True, help_text="Failed among the runs ended in the window (0 to 1).")
    duration = PercentilesSerializer(
        help_text="Running time (seconds) of the runs ended in the window.")
    series = PointSerializer(many=True, help_text="Runs started and ended per bucket.")
    live_series = LivePointSerializer(
        many=True, help_text="Live runs by state per bucket: the highest of the minutes "
                             "sampled in it, null where none was (samples are kept 8 days).")
    sample_seconds = serializers.IntegerField(help_text="Seconds between two samples.")
    time_to_stop = serializers.DictField(
        child=StopPathSerializer(),
        help_text="Requests applied in the window, by path: live, durable, sweeper.")
    pending_intents = serializers.IntegerField(help_text="Cancel or stop requests not yet "
                                                         "applied.")
    agents = AgentFiguresSerializer(many=True, help_text="The figures by agent, each agent "
                                                         "with a live run or one in the range.")


class OverviewView(APIView):
    @extend_schema(operation_id="overview", parameters=[OverviewQuery],
                   responses={200: OverviewSerializer, **ERRORS})
    def get(self, request):
        """The overview's charts: counts, runs started and ended over time, live runs by
        state over time, failure rate, running time percentiles and time to stop, overall
        and by agent, over the last ``window`` seconds or from ``since`` to ``until``."""
        asked = query(OverviewQuery, request)
        window, until = overview.time_range(**asked)
        return Response(OverviewSerializer(overview.overview(window=window, until=until)).data)


class WorkerSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="The process: node and pid.")
    alive = serializers.BooleanField(help_text="Renewed its leases within the last lease.")
    draining = serializers.BooleanField(help_text="Claims no new run; its attempts go on.")
    capacity = serializers.IntegerField()
    live_attempts = serializers.IntegerField()
    abandoned_tools = serializers.IntegerField(
        help_text="Blocking tool calls given up on whose threads still run.")
    last_seen = serializers.DateTimeField()
    drained_by = serializers.CharField(allow_null=True)
    drained_at = serializers.DateTimeField(allow_null=True)
    runs = serializers.ListField(child=serializers.UUIDField(),
                                 help_text="The runs of its live attempts.")


class WorkerPageSerializer(serializers.Serializer):
    results = WorkerSerializer(many=True)


class WorkerListView(APIView):
    @extend_schema(operation_id="workers_list", responses={200: WorkerPageSerializer, **ERRORS})
    def get(self, request):
        """The worker processes that reported in the last hour, alive ones first."""
        return Response({"results": [worker_data(w) for w in selectors.workers()]})


class WorkerDrainView(APIView):
    permission_classes = [IsOperator]
    draining = True

    @extend_schema(request=None, responses={200: WorkerSerializer, **ERRORS})
    def post(self, request, name):
        """Drain (it claims no new run; its live attempts go on) or undrain a worker."""
        validated(s.NoBodySerializer, request)
        domain.worker_drain(name=name, draining=self.draining, actor=actor(request))
        found = next(w for w in selectors.workers() if w.owner == name)
        return Response(worker_data(found))


class WorkerUndrainView(WorkerDrainView):
    draining = False
