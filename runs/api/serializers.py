"""The JSON shapes of API.md: requests validated here, answers described for the OpenAPI
document.

Runs and events are written by ``runs.domain.representation`` alone (the one
representation, also pushed on the sockets); the views answer with what it writes. The
answer serializers below (``RunSerializer``, ``EventSerializer`` and what they hold) only
describe that JSON to drf-spectacular: they never write a run, so they declare no
``source`` and no model. ``tests/test_api.py`` validates what the representation writes
against the document's schemas, so the two cannot drift.
"""

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.settings import api_settings

from runs.domain import catalogue, limits
from runs.domain.runs import LIVE_COMMANDS, MAX_BATCH
from runs.models import (
    Action,
    ActivityKind,
    EndCause,
    EventKind,
    OnExhausted,
    RunState,
    Source,
    StopCode,
    TicketReason,
)


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


class ActionSerializer(serializers.Serializer):
    tool = serializers.CharField(help_text="The tool the agent asks to call.")
    arguments = serializers.DictField(
        child=serializers.JSONField(), required=False,
        help_text="The arguments it asks to call it with (left out of a truncated push).")
    digest = serializers.CharField(
        help_text='SHA-256 hex of the canonical JSON (sorted keys, no spaces) of '
                  '{"tool": …, "arguments": …}.')
    rationale = serializers.CharField(allow_null=True, help_text="Why, as the agent says.")


class TicketSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    reason = serializers.ChoiceField(choices=TicketReason.choices)
    prompt = serializers.JSONField(allow_null=True)
    schema = serializers.JSONField(
        allow_null=True, help_text="JSON Schema the resume input must satisfy, if any.")
    action = ActionSerializer(
        allow_null=True,
        help_text='The one tool call an approval ticket is bound to; null when unbound. '
                  'Resume input: {"approved": true}, {"approved": true, "arguments": {…}} '
                  '(edited) or {"approved": false, "reason": str}, with an optional '
                  '"digest" that must be this one (else 409 ticket_mismatch).')
    created_at = serializers.DateTimeField()


class ToolCallSerializer(serializers.Serializer):
    tool = serializers.CharField()
    digest = serializers.CharField(help_text="SHA-256 of the canonical JSON of the call.")


class ReceiptSerializer(serializers.Serializer):
    provider_closed_at = serializers.DateTimeField(
        allow_null=True, help_text="When the provider connection open at the stop closed.")
    tokens_after_request = serializers.IntegerField(
        help_text="Streamed chunks that arrived after the request was committed.")
    tool_calls_in_flight = ToolCallSerializer(many=True)
    tool_calls_refused = serializers.IntegerField(
        help_text="Tool calls the host refused after the request was committed.")


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
        allow_null=True,
        help_text="The parent run whose end (or lost attempt) asked for this one.")
    receipt = ReceiptSerializer(
        allow_null=True, help_text="The stop receipt, once the attempt it stopped ended.")


class BudgetSerializer(serializers.Serializer):
    max_steps = serializers.IntegerField(allow_null=True)
    max_seconds = serializers.FloatField(allow_null=True)
    max_tokens = serializers.IntegerField(allow_null=True)
    max_cost_usd = serializers.FloatField(allow_null=True, help_text="US dollars.")
    max_repeats = serializers.IntegerField(
        allow_null=True,
        help_text="Calls of one tool with the same arguments allowed (the loop guard).")
    on_exhausted = serializers.ChoiceField(
        choices=OnExhausted.choices,
        help_text="Reaching a budget stops the run, or pauses it (ticket reason budget).")


class UsageSerializer(serializers.Serializer):
    steps = serializers.IntegerField()
    tokens = serializers.IntegerField()
    seconds = serializers.FloatField()
    cost_usd = serializers.FloatField(
        allow_null=True,
        help_text="US dollars of the committed steps' model calls; null when a model had "
                  "no price (AWAKEN_MODEL_PRICES).")


class RunSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    url = serializers.CharField(help_text="Path of the run's page.")
    agent = serializers.CharField(help_text="Name of the agent in the catalogue.")
    input = serializers.JSONField(required=False,
                                  help_text="Left out of a list page when truncated.")
    thread_id = serializers.CharField(help_text="Groups related runs.")
    parent_id = serializers.UUIDField(allow_null=True)
    rerun_of = serializers.UUIDField(
        allow_null=True, help_text="The run this one was started again from (Run again).")
    state = serializers.ChoiceField(choices=RunState.choices)
    end_cause = serializers.ChoiceField(choices=EndCause.choices, allow_null=True)
    stop_code = serializers.ChoiceField(choices=StopCode.choices, allow_null=True)
    stop_reason = serializers.CharField(allow_null=True)
    error = serializers.CharField(allow_null=True)
    output = serializers.JSONField(allow_null=True, required=False,
                                   help_text="Left out of a list page when truncated.")
    generation = serializers.IntegerField(
        help_text="Generation of the newest attempt; 0 until the first one starts.")
    owner = serializers.CharField(
        allow_null=True,
        help_text="The claim: worker node and pid of the live attempt; set exactly while running.")
    ticket = TicketSerializer(allow_null=True)
    control = ControlSerializer(allow_null=True)
    actions = serializers.ListField(
        child=serializers.ChoiceField(choices=Action.values),
        help_text="What the run's state allows an operator to ask of it now.")
    budget = BudgetSerializer()
    usage = UsageSerializer()
    duration = serializers.FloatField(
        help_text="Seconds of running time: closed attempts, plus the live one so far.")
    version = serializers.IntegerField(help_text="Equals the run's event count.")
    start_after = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    updated_at = serializers.DateTimeField()
    truncated = serializers.BooleanField(
        required=False,
        help_text="Present (true) on a run of a list page listed without its input and "
                  "output, which together were over AWAKEN_LIST_PAYLOAD_BYTES; "
                  "/api/runs/{id}/ has them.")


class EventSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    run_id = serializers.UUIDField()
    version = serializers.IntegerField(help_text="The run's version after this event.")
    kind = serializers.ChoiceField(choices=EventKind.choices)
    state = serializers.ChoiceField(choices=RunState.choices)
    end_cause = serializers.ChoiceField(choices=EndCause.choices, allow_null=True)
    generation = serializers.IntegerField()
    actor = serializers.CharField(allow_null=True)
    source = serializers.ChoiceField(choices=Source.choices, allow_null=True)
    data = serializers.JSONField()
    at = serializers.DateTimeField()


# --- Requests -------------------------------------------------------------------------


@extend_schema_field(limits.budget_schema())
class BudgetField(serializers.DictField):
    """A run's budget, handed on as given: ``runs.domain.limits.check_budget`` is the one
    rule for it (the domain applies it to every run made, whoever asks), and the document
    describes it from the same ``limits.BUDGETS``."""




class RunCreateSerializer(StrictSerializer):
    agent = serializers.ChoiceField(choices=[])  # the catalogue's names, when instantiated
    input = serializers.DictField(required=False, default=dict, error_messages={
        "not_a_dict": "The input must be a JSON object ({{…}}), not a {input_type}."})
    thread_id = serializers.CharField(required=False, max_length=200, allow_blank=False)
    parent_id = serializers.UUIDField(required=False, allow_null=True)
    budget = BudgetField(required=False)
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
    input = serializers.JSONField(
        required=False, allow_null=True,
        help_text='The answer. For a ticket bound to an action, a decision: '
                  '{"approved": true}, {"approved": true, "arguments": {…}} or '
                  '{"approved": false, "reason": str}, optionally with "digest".')


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


class ActivitySerializer(serializers.Serializer):
    seq = serializers.IntegerField(help_text="The entry's number in its run's log, from 1.")
    generation = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=ActivityKind.choices)
    text = serializers.CharField()
    ms = serializers.IntegerField(allow_null=True, help_text="How long it took, if timed.")
    tokens = serializers.IntegerField(allow_null=True)
    data = serializers.JSONField(allow_null=True)
    at = serializers.DateTimeField()


class ActivityPageSerializer(serializers.Serializer):
    results = ActivitySerializer(many=True)



# --- Query strings: one definition serves the validation and the OpenAPI document --------


class QueryInteger(serializers.IntegerField):
    """An integer of a query string: plain ASCII digits only (``limits.PLAIN_INTEGER``),
    whatever else int() would take."""

    def to_internal_value(self, data):
        if isinstance(data, str) and not limits.PLAIN_INTEGER.fullmatch(data):
            self.fail("invalid")
        return super().to_internal_value(data)


class QuerySeconds(serializers.FloatField):
    """Seconds in a query string: ASCII digits, with a decimal point at most."""

    def to_internal_value(self, data):
        if isinstance(data, str) and not limits.PLAIN_DECIMAL.fullmatch(data):
            self.fail("invalid")
        return super().to_internal_value(data)


class RunListQuery(serializers.Serializer):
    state = serializers.ChoiceField(choices=RunState.values, required=False)
    end_cause = serializers.ChoiceField(choices=EndCause.values, required=False)
    agent = serializers.CharField(required=False, max_length=100)
    thread_id = serializers.CharField(required=False, max_length=200)
    parent_id = serializers.UUIDField(required=False)
    ticket_reason = serializers.ChoiceField(
        choices=TicketReason.values, required=False,
        help_text="Awaiting runs whose open ticket has this reason (provider: paused for "
                  "their model provider).")
    cursor = serializers.CharField(required=False, max_length=200)
    limit = QueryInteger(required=False, default=50, min_value=1, max_value=500)


class EventsQuery(serializers.Serializer):
    after = QueryInteger(required=False, default=0, min_value=0, max_value=2**62)
    limit = QueryInteger(
        required=False, default=1000, min_value=1, max_value=1000,
        help_text="Events at most (page on with after = the last seq).")


class ActivityQuery(EventsQuery):
    limit = serializers.IntegerField(required=False, default=1000, min_value=1, max_value=1000)


class EventFeedQuery(EventsQuery):
    limit = QueryInteger(required=False, default=100, min_value=1, max_value=1000)


class WaitQuery(serializers.Serializer):
    wait = QuerySeconds(
        required=False, default=5.0, min_value=0, max_value=30,
        help_text="Seconds to wait for the committed result (0 = do not wait).")
