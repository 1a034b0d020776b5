"""The JSON shapes of API.md, declared for validation and the OpenAPI document.

Runs and events are written by ``runs.domain.representation`` (the one representation, also
pushed on the sockets); the serializers here declare the same shapes and hand their
``to_representation`` to it. A test holds the two to the same output.
"""

from django.utils import timezone
from rest_framework import serializers
from rest_framework.settings import api_settings

from runs.domain import catalogue
from runs.domain.representation import event_data, run_data, run_url
from runs.domain.runs import BUDGET_LIMITS, LIVE_COMMANDS, MAX_BATCH
from runs.models import Action, EndCause, Event, Run, RunState


class TicketSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    reason = serializers.CharField()
    prompt = serializers.JSONField(allow_null=True)
    schema = serializers.JSONField(
        allow_null=True, help_text="JSON Schema the resume input must satisfy, if any.")
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
    caused_by = serializers.UUIDField(
        allow_null=True, source="caused_by_id",
        help_text="The parent run whose end (or lost attempt) asked for this one.")


class StrictSerializer(serializers.Serializer):
    """A request object: a key it does not declare is refused, not ignored."""

    def to_internal_value(self, data):
        # Checked on the raw object, so it holds for nested objects and batch items too.
        unknown = set(data) - set(self.fields) if isinstance(data, dict) else set()
        if unknown:
            raise serializers.ValidationError({api_settings.NON_FIELD_ERRORS_KEY: [
                f"Unknown fields: {', '.join(sorted(unknown))}."]})
        return super().to_internal_value(data)


class OffsetDateTimeField(serializers.DateTimeField):
    """An ISO 8601 time with its UTC offset: a time without one names no instant."""

    default_error_messages = {"naive": "Give the time with its UTC offset (e.g. Z or +02:00)."}

    def enforce_timezone(self, value):
        if timezone.is_naive(value):
            self.fail("naive")
        return super().enforce_timezone(value)


class BudgetSerializer(StrictSerializer):
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


class RunSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField(help_text="Path of the run's page.")
    parent_id = serializers.UUIDField(allow_null=True)
    rerun_of = serializers.UUIDField(
        allow_null=True, source="rerun_of_id",
        help_text="The run this one was started again from (Run again).")
    ticket = TicketSerializer(allow_null=True)
    control = ControlSerializer(allow_null=True)
    budget = BudgetSerializer(source="*")
    usage = UsageSerializer(source="*")
    output = serializers.JSONField(allow_null=True, required=False,
                                   help_text="Left out of a list page when truncated.")
    input = serializers.JSONField(required=False,
                                  help_text="Left out of a list page when truncated.")
    truncated = serializers.BooleanField(
        required=False,
        help_text="Present (true) on a run of a list page listed without its input and "
                  "output, which together were over AWAKEN_LIST_PAYLOAD_BYTES; "
                  "/api/runs/{id}/ has them.")
    actions = serializers.ListField(
        source="allowed_actions",
        child=serializers.ChoiceField(choices=Action.values),
        help_text="What the run's state allows an operator to ask of it now.")
    duration = serializers.FloatField(
        help_text="Seconds of running time: closed attempts, plus the live one so far.")

    class Meta:
        model = Run
        fields = [
            "id", "url", "agent", "input", "thread_id", "parent_id", "rerun_of", "state",
            "end_cause", "stop_code", "stop_reason", "error", "output", "generation", "owner",
            "ticket", "control", "actions", "budget", "usage", "duration", "version",
            "start_after", "created_at", "started_at", "ended_at", "updated_at", "truncated",
        ]
        read_only_fields = fields

    def get_url(self, run) -> str:
        return run_url(run.id)

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


# --- Requests -------------------------------------------------------------------------


class RunCreateSerializer(StrictSerializer):
    agent = serializers.ChoiceField(choices=[])  # the catalogue's names, when instantiated
    input = serializers.DictField(required=False, default=dict)
    thread_id = serializers.CharField(required=False, max_length=200, allow_blank=False)
    parent_id = serializers.UUIDField(required=False, allow_null=True)
    budget = BudgetSerializer(required=False)
    start_after = OffsetDateTimeField(required=False, allow_null=True)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["agent"].choices = catalogue.names()


class RunBatchCreateSerializer(StrictSerializer):
    runs = RunCreateSerializer(many=True, allow_empty=False, max_length=MAX_BATCH,
                               help_text=f"1 to {MAX_BATCH} runs, each as for a single create.")


class CancelSerializer(StrictSerializer):
    reason = serializers.CharField(required=False, allow_null=True, allow_blank=True,
                                   max_length=500)


class StopSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=500, trim_whitespace=True)


class ResumeSerializer(StrictSerializer):
    ticket = serializers.UUIDField()
    input = serializers.JSONField(required=False, allow_null=True)


class DeliverSerializer(StrictSerializer):
    command = serializers.ChoiceField(choices=LIVE_COMMANDS)
    message = serializers.JSONField(
        required=False, allow_null=True,
        help_text="With command message: any JSON up to 64 KiB, for the attempt's live inbox.")


class NoBodySerializer(StrictSerializer):
    """A call that takes no body: an empty object, or nothing."""


class DeliveredSerializer(serializers.Serializer):
    delivered = serializers.BooleanField()
    generation = serializers.IntegerField()


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    detail = serializers.CharField()


class NotActiveSerializer(ErrorSerializer):
    run = RunSerializer(help_text="The run as committed.")


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
