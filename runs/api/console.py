"""The operations console's calls: run a run again, and the overview's figures."""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from runs import domain
from runs.api import serializers as s
from runs.api.permissions import IsOperator
from runs.api.views import ERRORS, source
from runs.domain import selectors
from runs.domain.errors import InvalidRequest
from runs.domain.representation import run_data


class RunRerunView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(
        operation_id="runs_rerun", request=None,
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
        responses={201: s.RunSerializer, 200: s.RunSerializer, **ERRORS})
    def post(self, request, run_id):
        """Run again: a new run with the same agent, input, budget and thread, whose
        ``rerun_of`` names this one (201); replaying an Idempotency-Key returns it (200)."""
        key = request.headers.get("Idempotency-Key") or None
        if key is not None and len(key) > 200:
            raise InvalidRequest("Idempotency-Key is longer than 200 characters.")
        run, created = domain.run_rerun(run_id=run_id, created_by=request.user,
                                        idempotency_key=key, source=source(request))
        if not created:
            run = selectors.run_get(run.id)
        return Response(run_data(run),
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
