"""Bulk jobs over REST: preview a selection, start a cancel or stop of every run in it as one
job that a worker carries out, follow its progress, abort it, list past jobs
(``runs.domain.bulk``). Progress is also pushed to the run list's sockets as
``bulk.changed`` messages."""

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from runs import domain
from runs.api.listing import RunFilter
from runs.api.permissions import IsOperator
from runs.api.serializers import NoBodySerializer, QueryInteger, StrictSerializer
from runs.api.views import ERRORS, OperatorPostMixin, actor, page, query, source, validated
from runs.domain.representation import bulk_data
from runs.models import BulkAction, BulkState


class SelectionSerializer(StrictSerializer):
    ids = serializers.ListField(
        child=serializers.UUIDField(), required=False, allow_empty=False,
        max_length=settings.AWAKEN_BULK_MAX_RUNS,
        help_text="The runs, by id (each must exist; runs that have ended are counted "
                  "unchanged).")
    filter = RunFilter(
        required=False,
        help_text="Or every run matching the run-list filters that has not ended.")

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = set(data) - set(self.fields)
            chosen = data.get("filter")
            if isinstance(chosen, dict):
                unknown |= {f"filter.{key}" for key in set(chosen) - set(RunFilter().fields)}
            if unknown:
                raise serializers.ValidationError({api_settings.NON_FIELD_ERRORS_KEY: [
                    f"Unknown fields: {', '.join(sorted(unknown))}."]})
        return super().to_internal_value(data)

    def validate(self, data):
        if ("ids" in data) == ("filter" in data):
            raise serializers.ValidationError("Give either ids or a filter.")
        return data


class BulkCreateSerializer(SelectionSerializer):
    action = serializers.ChoiceField(choices=BulkAction.values)
    reason = serializers.CharField(
        required=False, allow_blank=True, allow_null=True, max_length=500,
        help_text="Why; required for a stop (1 to 500 characters).")

    def validate(self, data):
        data = super().validate(data)
        if data["action"] == BulkAction.STOP and not (data.get("reason") or "").strip():
            raise serializers.ValidationError({"reason": ["A stop needs a reason."]})
        return data


class BulkPreviewSerializer(serializers.Serializer):
    total = serializers.IntegerField(help_text="Runs the job would select.")
    live = serializers.IntegerField(help_text="Of them, runs that have not ended.")


class BulkJobSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    action = serializers.ChoiceField(choices=BulkAction.values)
    reason = serializers.CharField(allow_null=True)
    filter = serializers.JSONField(allow_null=True,
                                   help_text="The filters that chose the runs; null for ids.")
    state = serializers.ChoiceField(choices=BulkState.values)
    total = serializers.IntegerField(help_text="Runs selected.")
    done = serializers.IntegerField(help_text="Runs handled: applied + unchanged + refused.")
    applied = serializers.IntegerField(help_text="The cancel, stop or resume was recorded.")
    unchanged = serializers.IntegerField(
        help_text="The run had already ended (a resume: it was not awaiting).")
    refused = serializers.IntegerField(help_text="The request was refused for that run.")
    requested_by = serializers.CharField()
    source = serializers.CharField()
    aborted_by = serializers.CharField(allow_null=True)
    version = serializers.IntegerField(help_text="+1 per change: keep the newest.")
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class BulkPageSerializer(serializers.Serializer):
    results = BulkJobSerializer(many=True)
    next = serializers.URLField(allow_null=True)


class BulkListQuery(serializers.Serializer):
    cursor = serializers.CharField(required=False, max_length=200)
    limit = QueryInteger(required=False, default=50, min_value=1, max_value=200)


def selection(data) -> dict:
    if "ids" in data:
        return {"ids": data["ids"]}
    return {"criteria": dict(data["filter"])}


class BulkListView(OperatorPostMixin, APIView):
    @extend_schema(operation_id="bulk_list", parameters=[BulkListQuery],
                   responses={200: BulkPageSerializer, **ERRORS})
    def get(self, request):
        """Bulk jobs, newest first, with who started them and how they went."""
        params = query(BulkListQuery, request)
        jobs, cursor = domain.bulk_jobs(cursor=params.get("cursor"), limit=params["limit"])
        return page(request, [bulk_data(job) for job in jobs], cursor)

    @extend_schema(operation_id="bulk_create", request=BulkCreateSerializer,
                   responses={201: BulkJobSerializer, **ERRORS})
    def post(self, request):
        """Cancel or stop the selected runs as one job, carried out on a worker: the
        answer is the queued job; follow it with GET /api/bulk/{id}/ or the run list's
        socket."""
        data = validated(BulkCreateSerializer, request)
        job = domain.bulk_create(action=data["action"], reason=data.get("reason"),
                                 requested_by=actor(request), created_by=request.user,
                                 source=source(request), **selection(data))
        return Response(bulk_data(job), status=status.HTTP_201_CREATED)


class BulkPreviewView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(operation_id="bulk_preview", request=SelectionSerializer,
                   responses={200: BulkPreviewSerializer, **ERRORS})
    def post(self, request):
        """How many runs a job over this selection would take, without starting it."""
        data = validated(SelectionSerializer, request)
        return Response(domain.bulk_preview(**selection(data)))


class BulkDetailView(APIView):
    @extend_schema(operation_id="bulk_retrieve", responses={200: BulkJobSerializer, **ERRORS})
    def get(self, request, job_id):
        """A job's state and progress."""
        return Response(bulk_data(domain.bulk_job_get(job_id)))


class BulkAbortView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(operation_id="bulk_abort", request=None,
                   responses={200: BulkJobSerializer, **ERRORS})
    def post(self, request, job_id):
        """Stop a queued or running job: the runs it has not reached are left as they are.
        A job that is over is answered as it is."""
        validated(NoBodySerializer, request)
        return Response(bulk_data(domain.bulk_job_abort(job_id=job_id, actor=actor(request))))
