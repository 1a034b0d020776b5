"""The JSON shapes of API.md: one representation of a run and of an event, used by the REST
API, the websocket snapshot and the broadcast alike.

The serializers declare the shapes (validation and the OpenAPI document come from them);
``run_data`` and ``event_data`` write them. DRF would rebuild every declared field for each
object it represents, which cost more than the database work on the hot paths, so the
serializers' ``to_representation`` calls these plain functions instead. A test holds the
two to the same output.
"""

import json

from django.utils import timezone
from rest_framework import serializers
from rest_framework.settings import api_settings

from runs import agents
from runs.models import EndCause, Event, Run, RunState
from runs.services.runs import BUDGET_LIMITS, MAX_BATCH


class TicketSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    reason = serializers.CharField()
    prompt = serializers.JSONField(allow_null=True)
    created_at = serializers.DateTimeField()


class ControlSerializer(serializers.Serializer):
    action = serializers.CharField()
    reason = serializers.CharField(allow_null=True)
    stop_code = serializers.CharField(allow_null=True)
    requested_by = serializers.CharField()
    source = serializers.CharField()
    requested_at = serializers.DateTimeField()
    delivered_at = serializers.DateTimeField(allow_null=True)
    applied_at = serializers.DateTimeField(allow_null=True)


class BudgetSerializer(serializers.Serializer):
    max_steps = serializers.IntegerField(allow_null=True, required=False, min_value=1,
                                         max_value=BUDGET_LIMITS["max_steps"])
    max_seconds = serializers.FloatField(allow_null=True, required=False, min_value=0.001,
                                         max_value=BUDGET_LIMITS["max_seconds"])
    max_tokens = serializers.IntegerField(allow_null=True, required=False, min_value=1,
                                          max_value=BUDGET_LIMITS["max_tokens"])


class UsageSerializer(serializers.Serializer):
    steps = serializers.IntegerField()
    tokens = serializers.IntegerField()
    seconds = serializers.FloatField(source="seconds_used")


def _when(value) -> str | None:
    """A datetime as DRF's ISO 8601 output writes it (current time zone, UTC as ``Z``)."""
    if value is None:
        return None
    text = timezone.localtime(value).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _ticket_data(ticket) -> dict | None:
    if ticket is None:
        return None
    return {"id": str(ticket.id), "reason": ticket.reason, "prompt": ticket.prompt,
            "created_at": _when(ticket.created_at)}


def _control_data(intent) -> dict | None:
    if intent is None:
        return None
    return {"action": intent.action, "reason": intent.reason, "stop_code": intent.stop_code,
            "requested_by": intent.requested_by, "source": intent.source,
            "requested_at": _when(intent.requested_at),
            "delivered_at": _when(intent.delivered_at), "applied_at": _when(intent.applied_at)}


def run_data(run: Run) -> dict:
    """The API representation of ``run`` (``RunSerializer``'s shape)."""
    return {
        "id": str(run.id), "agent": run.agent, "input": run.input, "thread_id": run.thread_id,
        "parent_id": None if run.parent_id is None else str(run.parent_id),
        "state": run.state, "end_cause": run.end_cause, "stop_code": run.stop_code,
        "stop_reason": run.stop_reason, "error": run.error, "output": run.output,
        "generation": run.generation, "owner": run.owner,
        "ticket": _ticket_data(run.ticket if run.ticket_id is not None else None),
        "control": _control_data(run.control if run.control_id is not None else None),
        "budget": {"max_steps": run.max_steps, "max_seconds": run.max_seconds,
                   "max_tokens": run.max_tokens},
        "usage": {"steps": run.steps, "tokens": run.tokens, "seconds": run.seconds_used},
        "version": run.version, "start_after": _when(run.start_after),
        "created_at": _when(run.created_at), "started_at": _when(run.started_at),
        "ended_at": _when(run.ended_at), "updated_at": _when(run.updated_at),
    }


def event_data(event: Event) -> dict:
    """The API representation of ``event`` (``EventSerializer``'s shape)."""
    return {"seq": event.seq, "run_id": str(event.run_id), "version": event.version,
            "kind": event.kind, "state": event.state, "end_cause": event.end_cause,
            "generation": event.generation, "actor": event.actor, "source": event.source,
            "data": event.data, "at": _when(event.at)}


class RunSerializer(serializers.ModelSerializer):
    parent_id = serializers.UUIDField(allow_null=True)
    ticket = TicketSerializer(allow_null=True)
    control = ControlSerializer(allow_null=True)
    budget = BudgetSerializer(source="*")
    usage = UsageSerializer(source="*")
    output = serializers.JSONField(allow_null=True)
    input = serializers.JSONField()

    class Meta:
        model = Run
        fields = [
            "id", "agent", "input", "thread_id", "parent_id", "state", "end_cause",
            "stop_code", "stop_reason", "error", "output", "generation", "owner", "ticket",
            "control",
            "budget", "usage", "version", "start_after", "created_at", "started_at",
            "ended_at", "updated_at",
        ]
        read_only_fields = fields

    def to_representation(self, instance):
        return run_data(instance)


class EventSerializer(serializers.ModelSerializer):
    run_id = serializers.UUIDField()

    class Meta:
        model = Event
        fields = ["seq", "run_id", "version", "kind", "state", "end_cause", "generation",
                  "actor", "source", "data", "at"]
        read_only_fields = fields

    def to_representation(self, instance):
        return event_data(instance)


def change_text(*, run: Run, event: Event) -> str:
    """The ``run.changed`` socket message for one committed event, encoded once."""
    return json.dumps({"type": "run.changed", "seq": event.seq, "event": event_data(event),
                       "run": run_data(run)})


# --- Requests -------------------------------------------------------------------------


class RunCreateSerializer(serializers.Serializer):
    agent = serializers.ChoiceField(choices=sorted(agents.CATALOGUE))
    input = serializers.DictField(required=False, default=dict)
    thread_id = serializers.CharField(required=False, max_length=200, allow_blank=False)
    parent_id = serializers.UUIDField(required=False, allow_null=True)
    budget = BudgetSerializer(required=False)
    start_after = serializers.DateTimeField(required=False, allow_null=True)

    def validate_start_after(self, value):
        if value is not None and value.tzinfo is None:
            raise serializers.ValidationError("start_after needs a UTC offset.")
        return value

    def to_internal_value(self, data):
        # Checked on the raw item, so it holds inside a batch as well.
        unknown = set(data) - set(self.fields) if isinstance(data, dict) else set()
        if unknown:
            raise serializers.ValidationError({api_settings.NON_FIELD_ERRORS_KEY: [
                f"Unknown fields: {', '.join(sorted(unknown))}."]})
        return super().to_internal_value(data)


class RunBatchCreateSerializer(serializers.Serializer):
    runs = RunCreateSerializer(many=True, allow_empty=False, max_length=MAX_BATCH,
                               help_text=f"1 to {MAX_BATCH} runs, each as for a single create.")


class CancelSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_null=True, allow_blank=True,
                                   max_length=500)


class StopSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, trim_whitespace=True)


class ResumeSerializer(serializers.Serializer):
    ticket = serializers.UUIDField()
    input = serializers.JSONField(required=False, allow_null=True)


class DeliverSerializer(serializers.Serializer):
    command = serializers.ChoiceField(choices=["cancel", "pause", "wake"])


class DeliveredSerializer(serializers.Serializer):
    delivered = serializers.BooleanField()
    generation = serializers.IntegerField()


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    detail = serializers.CharField()


class RunBatchSerializer(serializers.Serializer):
    results = RunSerializer(many=True)


class RunPageSerializer(serializers.Serializer):
    results = RunSerializer(many=True)
    next = serializers.URLField(allow_null=True)


class EventPageSerializer(serializers.Serializer):
    results = EventSerializer(many=True)



# --- Query strings: one definition serves the validation and the OpenAPI document --------


class RunListQuery(serializers.Serializer):
    state = serializers.ChoiceField(choices=RunState.values, required=False)
    end_cause = serializers.ChoiceField(choices=EndCause.values, required=False)
    agent = serializers.CharField(required=False, max_length=100)
    thread_id = serializers.CharField(required=False, max_length=200)
    parent_id = serializers.UUIDField(required=False)
    cursor = serializers.CharField(required=False, max_length=200)
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=500)


class EventsQuery(serializers.Serializer):
    after = serializers.IntegerField(required=False, default=0, min_value=0, max_value=2**62)


class EventFeedQuery(EventsQuery):
    limit = serializers.IntegerField(required=False, default=100, min_value=1, max_value=1000)


class WaitQuery(serializers.Serializer):
    wait = serializers.FloatField(
        required=False, default=5.0, min_value=0, max_value=30,
        help_text="Seconds to wait for the committed result (0 = do not wait).")
