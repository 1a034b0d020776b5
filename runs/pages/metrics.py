"""Prometheus metrics of stop health, served at /metrics.

What the database knows (runs by state, pending intents, time to stop by path, lease
expiries) is read at scrape time, so every web process reports the same, whole-system
figures. What happens inside one process (NotActive answers, ``runs.wire.web_side``) is
counted by that process.
"""

from datetime import timedelta

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from runs.models import AppliedVia, Attempt, CloseReason, ControlIntent, Run, WorkerProcess

STOP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class DatabaseCollector:
    """Whole-system figures, read from the database when scraped."""

    def collect(self):
        runs = GaugeMetricFamily("awaken_runs", "Runs by state and end cause.",
                                 labels=["state", "end_cause"])
        for row in Run.objects.values("state", "end_cause").annotate(n=Count("pk")).order_by():
            runs.add_metric([row["state"], row["end_cause"] or ""], row["n"])
        yield runs

        yield GaugeMetricFamily(
            "awaken_pending_intents", "Cancel or stop requests not yet applied.",
            value=ControlIntent.objects.filter(applied_at__isnull=True).count())

        yield self.time_to_stop()

        yield CounterMetricFamily(
            "awaken_lease_expiries", "Attempts whose lease expired (worker lost or frozen).",
            value=Attempt.objects.filter(close_reason=CloseReason.LOST).count())

        yield from self.workers()

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

    def time_to_stop(self) -> HistogramMetricFamily:
        """Requested -> terminal state committed, by the path that committed it."""
        took = ExpressionWrapper(F("applied_at") - F("requested_at"), output_field=DurationField())
        buckets = {f"le_{i}": Count("pk", filter=Q(took__lte=timedelta(seconds=bound)))
                   for i, bound in enumerate(STOP_BUCKETS)}
        rows = (ControlIntent.objects.filter(applied_at__isnull=False).annotate(took=took)
                .values("applied_via").annotate(total=Count("pk"), sum=Sum("took"), **buckets)
                .order_by())
        family = HistogramMetricFamily(
            "awaken_time_to_stop_seconds",
            "From a cancel or stop request to the committed terminal state, by path "
            "(live attempt, durable path, sweeper).", labels=["path"])
        for row in rows:
            cumulative = [(str(bound), row[f"le_{i}"]) for i, bound in enumerate(STOP_BUCKETS)]
            cumulative.append(("+Inf", row["total"]))
            total = row["sum"].total_seconds() if row["sum"] is not None else 0.0
            family.add_metric([row["applied_via"] or AppliedVia.LIVE], cumulative, total)
        return family


_registered = False


def register() -> None:
    global _registered
    if not _registered:
        REGISTRY.register(DatabaseCollector())
        _registered = True
