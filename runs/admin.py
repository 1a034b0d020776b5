"""A read-mostly console: state changes only through actions that call the domain."""

import uuid

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db import transaction
from django.forms.models import BaseInlineFormSet
from django.shortcuts import render
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html

from runs import domain
from runs.domain import keys, selectors, webhooks
from runs.domain.errors import ServiceError
from runs.domain.representation import run_url
from runs.domain.roles import is_operator
from runs.models import (
    ApiKey,
    Attempt,
    AuthFailure,
    ControlIntent,
    Event,
    ResumeTicket,
    Run,
    WebhookDelivery,
    WebhookEndpoint,
)

SOURCE = "admin"


def _apply(modeladmin, request, queryset, verb: str, call) -> None:
    """Call the domain for each selected row; count what it did and what it refused."""
    done, unchanged, refused = 0, 0, []
    for pk in queryset.values_list("pk", flat=True):
        try:
            changed = call(pk)
        except ServiceError as error:
            refused.append(f"{pk}: {error.message}")
            continue
        if changed:
            done += 1
        else:
            unchanged += 1
    if done:
        modeladmin.message_user(request, f"{verb}: {done} run(s).", messages.SUCCESS)
    if unchanged:
        modeladmin.message_user(request, f"{unchanged} run(s) had already ended; nothing changed.",
                                messages.INFO)
    for line in refused:
        modeladmin.message_user(request, line, messages.WARNING)


@admin.action(description="Cancel selected runs", permissions=["control"])
def cancel_runs(modeladmin, request, queryset):
    def call(run_id):
        result = domain.run_cancel(run_id=run_id, actor=request.user.get_username(),
                                     source=SOURCE)
        return result.path != "ended"

    _apply(modeladmin, request, queryset, "Cancel requested", call)


class StopForm(forms.Form):
    reason = forms.CharField(max_length=500, widget=forms.Textarea(attrs={"rows": 3}))


@admin.action(description="Stop selected runs (asks for a reason)", permissions=["control"])
def stop_runs(modeladmin, request, queryset):
    form = StopForm(request.POST if "apply" in request.POST else None)
    if form.is_valid():
        def call(run_id):
            result = domain.run_stop(run_id=run_id, actor=request.user.get_username(),
                                       source=SOURCE, reason=form.cleaned_data["reason"])
            return result.path != "ended"

        _apply(modeladmin, request, queryset, "Stop requested", call)
        return None
    return render(request, "admin/runs/stop_reason.html", {
        **modeladmin.admin_site.each_context(request),
        "title": "Stop runs",
        "form": form,
        "runs": queryset,
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        "opts": modeladmin.model._meta,
    })


@admin.action(description="Resume selected awaiting runs", permissions=["control"])
def resume_runs(modeladmin, request, queryset):
    def call(run_id):
        run = selectors.run_get(run_id)
        domain.run_resume(run_id=run_id, ticket_id=run.ticket_id,
                            actor=request.user.get_username(), source=SOURCE)
        return True

    _apply(modeladmin, request, queryset, "Resumed", call)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows are written by the domain only, and never deleted: they are the audit trail."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_control_permission(self, request):
        return is_operator(request.user)

    def get_changelist_instance(self, request):
        # PostgreSQL cannot take a NUL character as a parameter (a filter or a search would
        # fail the page), and no stored value holds one: answered as a bad lookup is.
        if any("\x00" in key or "\x00" in value
               for key, values in request.GET.lists() for value in values):
            raise IncorrectLookupParameters("A NUL character in the filters.")
        return super().get_changelist_instance(request)


RECENT_EVENTS = 10  # a run's admin page lists its newest events; the rest are one link away


class RecentEventsFormSet(BaseInlineFormSet):
    def get_queryset(self):
        # Sliced after the formset filtered to its run (a sliced queryset takes no filter).
        return super().get_queryset()[:RECENT_EVENTS]


class EventInline(admin.TabularInline):
    model = Event
    formset = RecentEventsFormSet
    verbose_name_plural = f"Events (the {RECENT_EVENTS} newest; all of them through the link above)"
    fields = ["seq", "version", "kind", "state", "end_cause", "generation", "actor", "source",
              "data", "at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ["-seq"]

    def has_add_permission(self, request, obj=None):
        return False


class AttemptInline(admin.TabularInline):
    model = Attempt
    fields = ["generation", "state", "close_reason", "owner", "lease_expires_at", "started_at",
              "closed_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ["id", "agent", "state", "end_cause", "stop_code", "generation", "thread_id",
                    "created_at"]
    list_filter = ["state", "end_cause", "stop_code", "agent"]
    search_fields = ["=id", "agent", "thread_id"]
    list_select_related = ["ticket", "control"]
    date_hierarchy = "created_at"
    raw_id_fields = ["parent"]
    actions = [cancel_runs, stop_runs, resume_runs]
    inlines = [AttemptInline, EventInline]
    readonly_fields = ["operator_page", "all_events"]
    # What an operator reads first; budgets and the worker's bookkeeping fold away.
    MAIN = ["operator_page", "all_events", "agent", "state", "end_cause", "stop_code",
            "stop_reason", "error", "input", "output", "thread_id", "parent", "rerun_of",
            "created_by", "created_at", "started_at", "ended_at"]
    USAGE = ["max_steps", "max_seconds", "max_tokens", "steps", "tokens", "seconds_used"]

    def get_fieldsets(self, request, obj=None):
        fields = [*self.readonly_fields, *(name for name in self.get_fields(request, obj)
                                           if name not in self.readonly_fields)]
        main = [name for name in self.MAIN if name in fields]
        usage = [name for name in self.USAGE if name in fields]
        rest = [name for name in fields if name not in main and name not in usage]
        return [(None, {"fields": main}),
                ("Budget and usage", {"fields": usage, "classes": ["collapse"]}),
                ("Attempts, claim and bookkeeping", {"fields": rest, "classes": ["collapse"]})]

    @admin.display(description="Operator page")
    def operator_page(self, run):
        return format_html('<a href="{}">Open the run\'s page</a> (live timeline, activity, '
                           'controls)', run_url(run.pk))

    @admin.display(description="Events")
    def all_events(self, run):
        url = reverse("admin:runs_event_changelist")
        return format_html('<a href="{}?run__id__exact={}">All {} events</a>, newest first',
                           url, run.pk, run.version)

    def get_search_fields(self, request):
        # "=id" compares as a UUID: a term that is not one must not make the page fail.
        try:
            uuid.UUID(request.GET.get("q", "").strip())
        except ValueError:
            return ["agent", "thread_id"]
        return self.search_fields


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ["run", "generation", "state", "close_reason", "owner", "lease_expires_at",
                    "started_at"]
    list_filter = ["state", "close_reason"]
    search_fields = ["owner", "=run__id"]
    list_select_related = ["run"]
    raw_id_fields = ["run"]


@admin.action(description="Revoke selected open tickets (stops their runs)",
              permissions=["control"])
def revoke_tickets(modeladmin, request, queryset):
    """An open ticket is the only thing that can wake its run: revoking it ends the run."""
    def call(ticket_id):
        result = domain.ticket_revoke(ticket_id=ticket_id, actor=request.user.get_username(),
                                      source=SOURCE)
        return result.path != "ended"

    _apply(modeladmin, request, queryset, "Ticket revoked, run stopped", call)


@admin.action(description="Resume with selected open tickets", permissions=["control"])
def resume_with_tickets(modeladmin, request, queryset):
    def call(ticket_id):
        ticket = selectors.ticket_get(ticket_id)
        domain.run_resume(run_id=ticket.run_id, ticket_id=ticket.pk,
                            actor=request.user.get_username(), source=SOURCE)
        return True

    _apply(modeladmin, request, queryset, "Resumed", call)


@admin.register(ResumeTicket)
class ResumeTicketAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "reason", "state", "generation", "created_at", "closed_at",
                    "closed_by"]
    list_filter = ["state", "reason"]
    search_fields = ["=id", "=run__id"]
    list_select_related = ["run"]
    raw_id_fields = ["run"]
    actions = [resume_with_tickets, revoke_tickets]


@admin.register(ControlIntent)
class ControlIntentAdmin(ReadOnlyAdmin):
    list_display = ["run", "action", "reason", "requested_by", "source", "requested_at",
                    "delivered_at", "applied_at"]
    list_filter = ["action", "source"]
    search_fields = ["=run__id", "requested_by", "reason"]
    list_select_related = ["run"]
    raw_id_fields = ["run"]


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["seq", "run", "version", "kind", "state", "end_cause", "generation", "actor",
                    "source", "at"]
    ordering = ["-seq"]
    list_filter = ["kind", "source"]
    search_fields = ["=run__id", "actor"]
    list_select_related = ["run"]
    raw_id_fields = ["run"]


@admin.action(description="Make a new API key (shown once; replaces the old one)",
              permissions=["change"])
def make_api_keys(modeladmin, request, queryset):
    """Keys are stored hashed: this page is the only place they are ever shown, so no key
    is replaced unless the page is made."""
    with transaction.atomic():
        made = [(user, keys.api_key_issue(user=user)) for user in queryset.order_by("pk")]
        page = render(request, "admin/runs/api_keys.html", {
            **modeladmin.admin_site.each_context(request),
            "title": "New API keys",
            "made": made,
            "opts": modeladmin.model._meta,
        })
    add_never_cache_headers(page)
    return page


User = get_user_model()
admin.site.unregister(User)


@admin.register(User)
class UserWithKeysAdmin(UserAdmin):
    actions = [*UserAdmin.actions, make_api_keys]


@admin.register(ApiKey)
class ApiKeyAdmin(ReadOnlyAdmin):
    """Who has a key and since when; new keys are made on the users' page. Deleting a key
    revokes it."""

    list_display = ["user", "prefix", "created_at"]
    search_fields = ["user__username", "=prefix"]
    list_select_related = ["user"]
    fields = ["user", "prefix", "created_at"]


@admin.register(AuthFailure)
class AuthFailureAdmin(ReadOnlyAdmin):
    """Failed checks of unknown keys, per address, counted by the throttle. Deleting a row
    lifts its lockout (failed logins are under Axes)."""

    list_display = ["scope", "ident", "failures", "last_failed_at"]
    list_filter = ["scope"]
    search_fields = ["=ident"]


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    """Endpoints are registered through the API (which checks the URL's host and shows the
    secret once); here they are inspected and switched off."""

    list_display = ("url", "events", "active", "created_by", "created_at")
    readonly_fields = ("url", "events", "created_by", "created_at")
    fields = ("url", "events", "active", "created_by", "created_at")

    def has_add_permission(self, request):
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ("id", "type", "endpoint", "state", "attempts", "last_status",
                    "next_attempt_at", "created_at")
    list_filter = ("state", "type")
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]
    actions = ["redeliver"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Send again now (same webhook-id)")
    def redeliver(self, request, queryset):
        for delivery in queryset.select_related("endpoint"):
            webhooks.redeliver(endpoint=delivery.endpoint, delivery_id=delivery.id)
        self.message_user(request, f"{queryset.count()} deliveries will be sent again.")
