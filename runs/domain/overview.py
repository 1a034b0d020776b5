"""Whole-system figures: the overview's charts and the stop health that /metrics serves.

Each figure is one bounded query over an indexed column: live runs by state (the state
index), and runs started, runs ended and requests applied within a range (the indexes on
``started_at``, ``ended_at`` and ``applied_at``), so the overview can be asked for every
few seconds whatever the size of the history. The history of live runs by state is no
query over runs (their rows do not say when a run waited in the queue or for input): the
sweeper samples it once a minute into ``LiveSample`` (``record_live_sample``), a table of
at most ``SAMPLES_KEPT`` / ``SAMPLE_SECONDS`` rows whatever the number of runs.
"""

import math
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import Count, DurationField, ExpressionWrapper, F, Max, Q, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from runs.domain.errors import InvalidRequest
from runs.domain.sql import quoted
from runs.models import (
    LIVE_STATES,
    STOP_BUCKETS,
    AppliedVia,
    ControlIntent,
    EndCause,
    LiveSample,
    Run,
)

PERCENTILES = (0.5, 0.95, 0.99)
MAX_POINTS = 180  # a window longer than 180 minutes is drawn in coarser buckets
MIN_WINDOW, MAX_WINDOW = 60, 7 * 86400
SAMPLE_SECONDS = 60  # live runs by state are sampled once a minute
SAMPLES_KEPT = timedelta(days=8)  # and kept a day longer than the longest range
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)  # a range reaches no further back


def time_to_stop(*, since: datetime | None = None, until: datetime | None = None) -> list[dict]:
    """Cancel and stop requests from the request to the committed terminal state, by the
    path that committed it (live attempt, durable path, sweeper): per path its ``count``,
    ``sum`` of seconds and cumulative ``buckets`` (``[(bound, count), ...]``, the last
    one ``+Inf``). All requests ever applied, or those applied from ``since`` to before
    ``until``."""
    took = ExpressionWrapper(F("applied_at") - F("requested_at"), output_field=DurationField())
    buckets = {f"le_{i}": Count("pk", filter=Q(took__lte=timedelta(seconds=bound)))
               for i, bound in enumerate(STOP_BUCKETS)}
    applied = ControlIntent.objects.filter(applied_at__isnull=False)
    if since is not None:
        applied = applied.filter(applied_at__gte=since)
    if until is not None:
        applied = applied.filter(applied_at__lt=until)
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


def time_range(*, window: int | None = None, since: datetime | None = None,
               until: datetime | None = None, now: datetime | None = None) -> tuple:
    """The overview's range as ``(window, until)``: the last ``window`` seconds (an hour
    if neither it nor ``since`` is given), or from ``since`` to ``until`` (now if not
    given); ``until`` is None for a range that ends now. An end after now ends now.
    Raises ``InvalidRequest`` for a range shorter than ``MIN_WINDOW`` or longer than
    ``MAX_WINDOW``, or for both a window and a start."""
    now = now or timezone.now()
    for given, name in ((since, "since"), (until, "until")):
        if given is not None and given < EARLIEST:
            raise InvalidRequest(f"The range's {name} is before {EARLIEST.year}: no run is "
                                 "that old.", field=name)
    if until is not None and until >= now:
        until = None
    if since is None:
        window = 3600 if window is None else window
    elif window is not None:
        raise InvalidRequest("Give a window or a start (since), not both.", field="since")
    else:
        seconds = ((until or now) - since).total_seconds()
        if seconds <= 0:
            raise InvalidRequest("The range's start (since) must be before its end (until).",
                                 field="since")
        window = math.ceil(seconds)
    if not MIN_WINDOW <= window <= MAX_WINDOW:
        raise InvalidRequest(f"A range is {MIN_WINDOW} s to {MAX_WINDOW // 86400} days long, "
                             f"not {span(window)}.", field="window" if since is None
                             else "since")
    return window, until


def span(seconds: float) -> str:
    """A length of time as people say it: 90 s, 5 min, 3 h, 9 days."""
    for size, unit in ((86400, " days"), (3600, " h"), (60, " min")):
        if seconds >= size:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds:.3g} s"


def live_runs() -> dict:
    """Live runs by state, now (the state index)."""
    live = dict.fromkeys(LIVE_STATES, 0)
    live.update(Run.objects.filter(state__in=LIVE_STATES).values_list("state")
                .annotate(n=Count("pk")).order_by())
    return live


def record_live_sample(*, now: datetime | None = None) -> bool:
    """Record live runs by state for the minute of ``now``, once (whether it did): the
    sweeper asks at every pass and its first pass of a minute writes the row (two
    sweepers at once write one: the minute is unique). Samples older than
    ``SAMPLES_KEPT`` go with it. One indexed read a pass, and three statements a minute,
    however many runs."""
    now = now or timezone.now()
    at = datetime.fromtimestamp(int(now.timestamp()) // SAMPLE_SECONDS * SAMPLE_SECONDS,
                                tz=UTC)
    if LiveSample.objects.filter(at=at).exists():
        return False
    LiveSample.objects.bulk_create([LiveSample(at=at, **live_runs())], ignore_conflicts=True)
    LiveSample.objects.filter(at__lt=at - SAMPLES_KEPT).delete()
    return True


def overview(*, window: int = 3600, until: datetime | None = None,
             now: datetime | None = None) -> dict:
    """The overview's figures over ``window`` seconds up to ``until`` (None: now), in
    whole buckets (the last one still filling when the range ends now): live runs by
    state now; runs ended in the range by end cause, its failure rate and the running
    time percentiles of those runs; runs started and ended per bucket; live runs by state
    per bucket, from the samples (the highest sampled; None where none was); time to stop
    by path and the requests still pending; and per agent its live runs, its runs ended
    by cause and its time to stop."""
    now = now or timezone.now()
    end = min(until or now, now)
    bucket = bucket_seconds(window)
    points = math.ceil(window / bucket)
    last = int(end.timestamp()) // bucket * bucket
    since = datetime.fromtimestamp(last - (points - 1) * bucket, tz=UTC)
    edge = datetime.fromtimestamp(last + bucket, tz=UTC)  # the end of the last bucket
    within = {"gte": since, "lt": edge}

    agents: dict[str, dict] = {}

    def of(name: str) -> dict:
        if name not in agents:
            agents[name] = {"agent": name, "live": dict.fromkeys(LIVE_STATES, 0),
                            "ended": dict.fromkeys(EndCause.values, 0), "failure_rate": None,
                            "time_to_stop": {"count": 0, "mean": None, "max": None}}
        return agents[name]

    live = dict.fromkeys(LIVE_STATES, 0)
    for name, state, count in (Run.objects.filter(state__in=LIVE_STATES)
                               .values_list("agent", "state").annotate(n=Count("pk"))
                               .order_by()):
        of(name)["live"][state] = count
        live[state] += count
    ended = dict.fromkeys(EndCause.values, 0)
    for name, cause, count in (Run.objects.filter(**lookups("ended_at", within))
                               .values_list("agent", "end_cause").annotate(n=Count("pk"))
                               .order_by()):
        of(name)["ended"][cause] = count
        ended[cause] += count
    total_ended = sum(ended.values())
    took = ExpressionWrapper(F("applied_at") - F("requested_at"), output_field=DurationField())
    for name, count, total, slowest in (
            ControlIntent.objects.filter(**lookups("applied_at", within)).annotate(took=took)
            .values_list("run__agent").annotate(n=Count("pk"), sum=Sum("took"),
                                                slowest=Max("took"))
            .values_list("run__agent", "n", "sum", "slowest").order_by()):
        of(name)["time_to_stop"] = {"count": count, "mean": total.total_seconds() / count,
                                    "max": slowest.total_seconds()}
    for figures in agents.values():
        count = sum(figures["ended"].values())
        if count:
            figures["failure_rate"] = figures["ended"][EndCause.FAILED] / count

    series = [{"at": since + timedelta(seconds=i * bucket), "started": 0, "ended": 0}
              for i in range(points)]
    for column, key in (("started_at", "started"), ("ended_at", "ended")):
        per_minute = (Run.objects.filter(**lookups(column, within))
                      .annotate(minute=TruncMinute(column)).values_list("minute")
                      .annotate(n=Count("pk")).order_by())
        for minute, count in per_minute:
            index = int((minute - since).total_seconds()) // bucket
            if 0 <= index < points:
                series[index][key] += count

    history = [{"at": point["at"], **dict.fromkeys(LIVE_STATES)} for point in series]
    for at, *counts in (LiveSample.objects.filter(**lookups("at", within))
                        .values_list("at", *LIVE_STATES).order_by()):
        point = history[int((at - since).total_seconds()) // bucket]
        for state, count in zip(LIVE_STATES, counts, strict=True):
            point[state] = count if point[state] is None else max(point[state], count)
    if until is None:
        history.append({"at": now, **live})  # the figures of the cards, now

    return {
        "window": window, "bucket": bucket, "since": since, "until": end,
        "runs": live,
        "ended": ended,
        "failure_rate": ended[EndCause.FAILED] / total_ended if total_ended else None,
        "duration": {"count": total_ended, **running_time_percentiles(since, edge)},
        "series": series,
        "live_series": history,
        "sample_seconds": SAMPLE_SECONDS,
        "time_to_stop": {row["path"]: row for row in time_to_stop(since=since, until=edge)},
        "pending_intents": ControlIntent.objects.filter(applied_at__isnull=True).count(),
        "agents": [agents[name] for name in sorted(agents)],
    }


def lookups(column: str, within: dict) -> dict:
    return {f"{column}__{operator}": value for operator, value in within.items()}


def running_time_percentiles(since: datetime, until: datetime) -> dict:
    """p50, p95 and p99 of the running time of the runs ended from ``since`` to before
    ``until`` (None when there are none), interpolated between neighbours as
    PostgreSQL's percentile_cont."""
    names = [f"p{round(p * 100)}" for p in PERCENTILES]
    if connection.vendor == "postgresql":
        quote = quoted
        table = quote(Run._meta.db_table)
        seconds = quote(Run._meta.get_field("seconds_used").column)
        ended_at = quote(Run._meta.get_field("ended_at").column)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT percentile_cont(%s::float8[]) WITHIN GROUP (ORDER BY {seconds}) "
                f"FROM {table} WHERE {ended_at} >= %s AND {ended_at} < %s",
                [list(PERCENTILES), since, until])
            values = cursor.fetchone()[0] or [None] * len(PERCENTILES)
        return dict(zip(names, values, strict=True))
    seconds = sorted(Run.objects.filter(ended_at__gte=since, ended_at__lt=until)
                     .values_list("seconds_used", flat=True))
    return {name: percentile(seconds, p) for name, p in zip(names, PERCENTILES, strict=True)}


def percentile(ordered: list[float], fraction: float) -> float | None:
    """The ``fraction`` percentile of ``ordered`` values, linearly interpolated."""
    if not ordered:
        return None
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
