"""Whole-system figures: the overview's charts and the stop health that /metrics serves.

Each figure is one bounded query over an indexed column: live runs by state (the state
index), and runs started, runs ended and requests applied within a window (the indexes on
``started_at``, ``ended_at`` and ``applied_at``), so the overview can be asked for every
few seconds whatever the size of the history.
"""

import math
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from runs.domain.sql import quoted
from runs.models import LIVE_STATES, STOP_BUCKETS, AppliedVia, ControlIntent, EndCause, Run

PERCENTILES = (0.5, 0.95, 0.99)
MAX_POINTS = 180  # a window longer than 180 minutes is drawn in coarser buckets
MIN_WINDOW, MAX_WINDOW = 60, 86400


def time_to_stop(*, since: datetime | None = None) -> list[dict]:
    """Cancel and stop requests from the request to the committed terminal state, by the
    path that committed it (live attempt, durable path, sweeper): per path its ``count``,
    ``sum`` of seconds and cumulative ``buckets`` (``[(bound, count), ...]``, the last
    one ``+Inf``). All requests ever applied, or those applied since ``since``."""
    took = ExpressionWrapper(F("applied_at") - F("requested_at"), output_field=DurationField())
    buckets = {f"le_{i}": Count("pk", filter=Q(took__lte=timedelta(seconds=bound)))
               for i, bound in enumerate(STOP_BUCKETS)}
    applied = ControlIntent.objects.filter(applied_at__isnull=False)
    if since is not None:
        applied = applied.filter(applied_at__gte=since)
    rows = (applied.annotate(took=took).values("applied_via")
            .annotate(total=Count("pk"), sum=Sum("took"), **buckets).order_by("applied_via"))
    return [{
        "path": row["applied_via"] or AppliedVia.LIVE,
        "count": row["total"],
        "sum": row["sum"].total_seconds() if row["sum"] is not None else 0.0,
        "buckets": [*((str(bound), row[f"le_{i}"]) for i, bound in enumerate(STOP_BUCKETS)),
                    ("+Inf", row["total"])],
    } for row in rows]


def bucket_seconds(window: int) -> int:
    """Minutes, or as many whole minutes as keep the window within ``MAX_POINTS``."""
    return 60 * max(1, math.ceil(window / 60 / MAX_POINTS))


def overview(*, window: int = 3600, now: datetime | None = None) -> dict:
    """The overview's figures over the last ``window`` seconds (in whole buckets, the last
    one still filling): live runs by state now; runs ended in the window by end cause, its
    failure rate and the running time percentiles of those runs; runs started and ended
    per bucket; time to stop by path and the requests still pending."""
    now = now or timezone.now()
    bucket = bucket_seconds(window)
    points = math.ceil(window / bucket)
    last = int(now.timestamp()) // bucket * bucket
    since = datetime.fromtimestamp(last - (points - 1) * bucket, tz=UTC)

    live = dict.fromkeys(LIVE_STATES, 0)
    live.update(Run.objects.filter(state__in=LIVE_STATES).values_list("state")
                .annotate(n=Count("pk")).order_by())
    ended_runs = Run.objects.filter(ended_at__gte=since)
    ended = dict.fromkeys(EndCause.values, 0)
    ended.update(ended_runs.values_list("end_cause").annotate(n=Count("pk")).order_by())
    total_ended = sum(ended.values())

    series = [{"at": since + timedelta(seconds=i * bucket), "started": 0, "ended": 0}
              for i in range(points)]
    for column, key in (("started_at", "started"), ("ended_at", "ended")):
        per_minute = (Run.objects.filter(**{f"{column}__gte": since})
                      .annotate(minute=TruncMinute(column)).values_list("minute")
                      .annotate(n=Count("pk")).order_by())
        for minute, count in per_minute:
            index = int((minute - since).total_seconds()) // bucket
            if 0 <= index < points:
                series[index][key] += count

    return {
        "window": window, "bucket": bucket, "since": since, "until": now,
        "runs": live,
        "ended": ended,
        "failure_rate": ended[EndCause.FAILED] / total_ended if total_ended else None,
        "duration": {"count": total_ended, **running_time_percentiles(since)},
        "series": series,
        "time_to_stop": {row["path"]: row for row in time_to_stop(since=since)},
        "pending_intents": ControlIntent.objects.filter(applied_at__isnull=True).count(),
    }


def running_time_percentiles(since: datetime) -> dict:
    """p50, p95 and p99 of the running time of the runs ended since ``since`` (None when
    there are none), interpolated between neighbours as PostgreSQL's percentile_cont."""
    names = [f"p{round(p * 100)}" for p in PERCENTILES]
    if connection.vendor == "postgresql":
        quote = quoted
        table = quote(Run._meta.db_table)
        seconds = quote(Run._meta.get_field("seconds_used").column)
        ended_at = quote(Run._meta.get_field("ended_at").column)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT percentile_cont(%s::float8[]) WITHIN GROUP (ORDER BY {seconds}) "
                f"FROM {table} WHERE {ended_at} >= %s", [list(PERCENTILES), since])
            values = cursor.fetchone()[0] or [None] * len(PERCENTILES)
        return dict(zip(names, values, strict=True))
    seconds = sorted(Run.objects.filter(ended_at__gte=since)
                     .values_list("seconds_used", flat=True))
    return {name: percentile(seconds, p) for name, p in zip(names, PERCENTILES, strict=True)}


def percentile(ordered: list[float], fraction: float) -> float | None:
    """The ``fraction`` percentile of ``ordered`` values, linearly interpolated."""
    if not ordered:
        return None
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
