"""Prometheus metrics of stop health, served at /metrics.

They reveal agent names and volumes, so a scrape needs an API key (of a viewer or an
operator, as the REST API) or a session, or comes from an address of
``AWAKEN_METRICS_ALLOWED_ADDRESSES`` (this host by default); ``AWAKEN_METRICS_PUBLIC``
serves them to anyone.

What the database knows (runs by state, pending intents, time to stop by path, lease
expiries) is read at scrape time, so every web process reports the same, whole-system
figures. The totals are kept by the database as changes commit (``runs.domain.totals``),
so a scrape costs the same with a thousand runs or a million. What happens inside one
process (NotActive answers, ``runs.workers.dispatch``) is counted by that process.
"""

import ipaddress
from datetime import timedelta

from django.conf import settings
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from rest_framework.permissions import BasePermission
from rest_framework.views import APIView

from runs.domain.roles import is_viewer
from runs.domain.totals import totals
from runs.models import ControlIntent, WorkerProcess


def address_allowed(address: str | None) -> bool:
    """Whether a client at ``address`` may scrape without a key."""
    try:
        client = ipaddress.ip_address(address or "")
    except ValueError:
        return False
    client = getattr(client, "ipv4_mapped", None) or client  # ::ffff:127.0.0.1 is IPv4's
    return any(client in network for network in settings.AWAKEN_METRICS_ALLOWED_ADDRESSES)


class MayScrape(BasePermission):
    message = ("/metrics needs an API key of a viewer or an operator, or a client address "
               "in AWAKEN_METRICS_ALLOWED_ADDRESSES.")

    def has_permission(self, request, view):
        return (settings.AWAKEN_METRICS_PUBLIC
                or address_allowed(request.META.get("REMOTE_ADDR"))
                or is_viewer(request.user))


@extend_schema(exclude=True)
class MetricsView(APIView):
    """Prometheus exposition, for scrapers. An unauthenticated scrape is 401 with the
    API's error body (code ``not_authenticated``), a key without a role 403."""

    permission_classes = [MayScrape]

    def perform_authentication(self, request):
        pass  # lazy: a public or allowed scrape is served whatever it sends

    def get(self, request):
        register()
        return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


class DatabaseCollector:
    """Whole-system figures, read from the database when scraped."""

    def collect(self):
        now = totals()
        runs = GaugeMetricFamily("awaken_runs", "Runs by state and end cause.",
                                 labels=["state", "end_cause"])
        for (state, end_cause), count in sorted(now["runs"].items()):
            runs.add_metric([state, end_cause], count)
        yield runs

        # Bounded by the requests pending, through the partial unique index on them
        # (runs_intent_one_pending_per_run).
        yield GaugeMetricFamily(
            "awaken_pending_intents", "Cancel or stop requests not yet applied.",
            value=ControlIntent.objects.filter(applied_at__isnull=True).count())

        yield self.time_to_stop(now["time_to_stop"])

        yield CounterMetricFamily(
            "awaken_lease_expiries", "Attempts whose lease expired (worker lost or frozen).",
            value=now["lost"])

        yield from self.receipts(now["receipts"])
        failures = CounterMetricFamily(
            "awaken_webhook_delivery_failures",
            "Webhook attempts that failed (an answer other than 2xx, a timeout, a refused "
            "connection), by what followed: retry (tried again later) or gave_up (the "
            "delivery is marked failed).", labels=["result"])
        for result, count in sorted(now["webhook_failures"].items()):
            failures.add_metric([result], count)
        yield failures
        yield from self.workers()

    def receipts(self, totals):
        """What the stop receipts add up to (``runs.domain.receipts``)."""
        for name, total, text in (
                ("awaken_stop_receipts", "receipts",
                 "Cancels and stops of running runs with a stop receipt."),
                ("awaken_stop_tokens_after_request", "late_tokens",
                 "Streamed chunks that arrived after a cancel or stop was requested."),
                ("awaken_stop_tool_calls_in_flight", "tools_in_flight",
                 "Tool calls in flight when their run was cancelled or stopped."),
                ("awaken_stop_tool_calls_refused", "tools_refused",
                 "Tool calls refused by the host after a cancel or stop was requested.")):
            yield CounterMetricFamily(name, text, value=totals[total])

    def workers(self):
        """What each worker process reported with its last lease renewal (those heard from
        within three renewals)."""
        live = GaugeMetricFamily("awaken_worker_live_attempts",
                                 "Live attempts of a worker process.", labels=["owner"])
        abandoned = GaugeMetricFamily(
            "awaken_worker_abandoned_tools",
            "Blocking tool calls a worker process gave up on whose threads still run; at "
            "its tool thread limit, blocking tools fail at once.", labels=["owner"])
        recent = timezone.now() - timedelta(seconds=settings.AWAKEN_LEASE_SECONDS)
        for owner, attempts, tools in WorkerProcess.objects.filter(
                reported_at__gte=recent).values_list("owner", "live_attempts",
                                                     "abandoned_tools"):
            live.add_metric([owner], attempts)
            abandoned.add_metric([owner], tools)
        yield live
        yield abandoned

    def time_to_stop(self, rows) -> HistogramMetricFamily:
        """Requested -> terminal state committed, by the path that committed it."""
        family = HistogramMetricFamily(
            "awaken_time_to_stop_seconds",
            "From a cancel or stop request to the committed terminal state, by path "
            "(live attempt, durable path, sweeper).", labels=["path"])
        for row in rows:
            family.add_metric([row["path"]], row["buckets"], row["sum"])
        return family


_registered = False


def register() -> None:
    global _registered
    if not _registered:
        REGISTRY.register(DatabaseCollector())
        _registered = True
