"""The run-list filters: one declaration for the list's query string, the bulk jobs'
selection and the OpenAPI document; ``runs.domain.selectors.matching`` applies them."""

from django.utils.dateparse import parse_datetime
from rest_framework import serializers

from runs.api.serializers import QueryInteger, RunListQuery
from runs.domain.selectors import SORT_CHOICES, id_range
from runs.models import EndCause, RunState

STATUSES = [*RunState.values, *EndCause.values]


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 date and time with its UTC offset; one without is refused, not guessed."""

    def to_internal_value(self, value):
        if isinstance(value, str):
            parsed = None
            try:
                parsed = parse_datetime(value.strip())
            except ValueError:
                pass
            if parsed is not None and parsed.tzinfo is None:
                raise serializers.ValidationError("Give the time with its UTC offset "
                                                  "(2026-01-31T12:00:00+00:00).")
        return super().to_internal_value(value)


class StatusField(serializers.CharField):
    """States or end causes, comma-separated (``running,failed``) or, in a JSON body, a
    list."""

    def to_internal_value(self, data):
        if isinstance(data, list) and all(isinstance(item, str) for item in data):
            data = ",".join(data)
        values = [part.strip() for part in super().to_internal_value(data).split(",")]
        values = [value for value in values if value]
        unknown = [value for value in values if value not in STATUSES]
        if unknown:
            raise serializers.ValidationError(
                f"Unknown status {unknown[0]!r}; give any of {', '.join(STATUSES)}.")
        return list(dict.fromkeys(values))


class RunFilter(RunListQuery):
    """Which runs: the list's filters, without its paging."""

    cursor = None
    limit = None
    status = StatusField(
        required=False, max_length=200,
        help_text="States or end causes, any of them: comma-separated (running,failed) or "
                  "the parameter repeated.")
    id_prefix = serializers.CharField(
        required=False, max_length=36,
        help_text="The run id starts with these hex digits (the short id the list shows).")
    q = serializers.CharField(required=False, max_length=200,
                              help_text="Search: an id prefix, a thread id or an agent.")
    error = serializers.CharField(required=False, max_length=200,
                                  help_text="Failed runs whose error contains this text.")
    created_after = AwareDateTimeField(
        required=False, help_text="Created at or after (ISO 8601 with offset).")
    created_before = AwareDateTimeField(
        required=False, help_text="Created before (ISO 8601 with offset).")

    def validate_id_prefix(self, value):
        if id_range(value) is None:
            raise serializers.ValidationError("Give 1 to 32 hex digits of a run id.")
        return value

    def validate(self, data):
        after, before = data.get("created_after"), data.get("created_before")
        if after is not None and before is not None and after >= before:
            raise serializers.ValidationError("created_after must be before created_before.")
        return data


class RunSearchQuery(RunFilter):
    """The run list's query string: the filters, the order and the page."""

    sort = serializers.ChoiceField(
        choices=SORT_CHOICES, required=False, default="-created",
        help_text="created, started, ended or duration (running time); - first for "
                  "descending. Runs not started or not ended yet sort after every time.")
    cursor = serializers.CharField(required=False, max_length=300)
    limit = QueryInteger(required=False, default=50, min_value=1, max_value=500)


def query_data(request) -> dict:
    """The query string as one value per key, blank values left out; a repeated ``status``
    is joined into one list."""
    data = {key: value for key, value in request.query_params.items() if value != ""}
    statuses = [value for value in request.query_params.getlist("status") if value != ""]
    if len(statuses) > 1:
        data["status"] = ",".join(statuses)
    return data


def run_search(request) -> dict:
    """The validated query string of the run list."""
    serializer = RunSearchQuery(data=query_data(request))
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)

