"""Webhook endpoints (operators): register, list, their deliveries and a redeliver
(``runs.domain.webhooks``)."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from runs.api.permissions import IsOperator
from runs.api.serializers import NoBodySerializer, StrictSerializer
from runs.api.views import ERRORS, validated
from runs.domain import webhooks
from runs.domain.representation import when
from runs.models import WebhookEvent


def endpoint_data(endpoint, *, secret: bool = False) -> dict:
    data = {"id": str(endpoint.id), "url": endpoint.url, "events": endpoint.events,
            "active": endpoint.active, "created_by": endpoint.created_by.get_username(),
            "created_at": when(endpoint.created_at)}
    if secret:  # shown once, when it is made
        data["secret"] = endpoint.secret
    return data


def delivery_data(delivery) -> dict:
    return {"id": f"msg_{delivery.id.hex}", "delivery_id": str(delivery.id),
            "type": delivery.type, "state": delivery.state, "attempts": delivery.attempts,
            "last_status": delivery.last_status, "last_error": delivery.last_error or None,
            "next_attempt_at": when(delivery.next_attempt_at),
            "created_at": when(delivery.created_at),
            "delivered_at": when(delivery.delivered_at)}


class WebhookCreateSerializer(StrictSerializer):
    url = serializers.CharField(max_length=2000)
    events = serializers.ListField(child=serializers.ChoiceField(choices=WebhookEvent.values),
                                   allow_empty=False, max_length=len(WebhookEvent.values))
    secret = serializers.CharField(required=False, max_length=100)


class WebhookSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    url = serializers.CharField()
    events = serializers.ListField(child=serializers.CharField())
    active = serializers.BooleanField()
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    secret = serializers.CharField(required=False, help_text="Only in the answer to a create.")


class DeliverySerializer(serializers.Serializer):
    id = serializers.CharField(help_text="The webhook-id header, the same on every attempt.")
    delivery_id = serializers.UUIDField()
    type = serializers.CharField()
    state = serializers.CharField()
    attempts = serializers.IntegerField()
    last_status = serializers.IntegerField(allow_null=True)
    last_error = serializers.CharField(allow_null=True)
    next_attempt_at = serializers.DateTimeField()
    created_at = serializers.DateTimeField()
    delivered_at = serializers.DateTimeField(allow_null=True)


class WebhookPageSerializer(serializers.Serializer):
    results = WebhookSerializer(many=True)


class DeliveryPageSerializer(serializers.Serializer):
    results = DeliverySerializer(many=True)


class WebhooksView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(operation_id="webhooks_list",
                   responses={200: WebhookPageSerializer, **ERRORS})
    def get(self, request):
        from runs.models import WebhookEndpoint

        return Response({"results": [endpoint_data(e) for e in
                                     WebhookEndpoint.objects.select_related("created_by")]})

    @extend_schema(operation_id="webhooks_create", request=WebhookCreateSerializer,
                   responses={201: WebhookSerializer, **ERRORS})
    def post(self, request):
        """Register an endpoint; the answer shows its secret, once."""
        data = validated(WebhookCreateSerializer, request)
        endpoint = webhooks.endpoint_create(url=data["url"], events=data["events"],
                                            secret=data.get("secret"),
                                            created_by=request.user)
        return Response(endpoint_data(endpoint, secret=True), status=status.HTTP_201_CREATED)


class DeliveriesView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(operation_id="webhooks_deliveries",
                   responses={200: DeliveryPageSerializer, **ERRORS})
    def get(self, request, endpoint_id):
        """The endpoint's deliveries, newest first (the last 100)."""
        endpoint = webhooks.endpoint_get(endpoint_id)
        return Response({"results": [delivery_data(d)
                                     for d in webhooks.deliveries_of(endpoint)]})


class RedeliverView(APIView):
    permission_classes = [IsOperator]

    @extend_schema(operation_id="webhooks_redeliver", request=NoBodySerializer,
                   responses={200: DeliverySerializer, **ERRORS})
    def post(self, request, endpoint_id, delivery_id):
        """Send a delivery again, now, with the same webhook-id."""
        validated(NoBodySerializer, request)
        endpoint = webhooks.endpoint_get(endpoint_id)
        return Response(delivery_data(webhooks.redeliver(endpoint=endpoint,
                                                         delivery_id=delivery_id)))
