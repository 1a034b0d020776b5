"""The whole-system totals of /metrics, read at a cost that does not grow with the tables.

The database keeps them: its triggers (migration ``0017_metric_totals``) add a row to
``MetricDelta`` in the transaction of every change to what is counted, whichever code
made it (a transition, a bulk import, a delete). A read sums the rows; once more than
``FOLD_AFTER`` of them have come since they were last folded into one per total, it folds
them for the next read. A read is a few dozen rows plus the changes since the last fold.
"""

from django.db import connection, transaction
from django.db.models import Count, Max, Sum

from runs.domain.overview import STOP_BUCKETS
from runs.domain.receipts import RECEIPT_TOTALS
from runs.domain.sql import quoted
from runs.domain.webhooks import WEBHOOK_FAILURES
from runs.models import MetricDelta

FOLD_AFTER = 200


def fold() -> None:
    """Replace the delta rows by one row per total (totals that came to zero go).

    On PostgreSQL one statement deletes the rows it sees and inserts their sums: a fold
    running at the same time skips the rows this one deleted and never counts one twice;
    rows committed meanwhile stay for the next fold. SQLite has one writer at a time.

    Its commit need not wait for the disk (``synchronous_commit`` off): it changes no total,
    so losing it in a crash only leaves the rows unfolded."""
    table = quoted(MetricDelta._meta.db_table)
    if connection.vendor == "postgresql":
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
            cursor.execute(
                f"WITH gone AS (DELETE FROM {table} RETURNING name, key, value) "
                f"INSERT INTO {table} (name, key, value) SELECT name, key, sum(value) "
                f"FROM gone GROUP BY name, key HAVING sum(value) <> 0")
        return
    with transaction.atomic():
        last = MetricDelta.objects.aggregate(last=Max("id"))["last"]
        if last is None:
            return
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (name, key, value) SELECT name, key, sum(value) "
                f"FROM {table} WHERE id <= %s GROUP BY name, key HAVING sum(value) <> 0",
                [last])
        MetricDelta.objects.filter(id__lte=last).delete()


def totals() -> dict:
    """``runs``: ``{(state, end_cause or ""): count}``; ``lost``: attempts whose lease
    expired; ``time_to_stop``: per path its ``count``, ``sum`` (seconds) and cumulative
    ``buckets`` (``[(bound, count), ...]``, the last ``+Inf``), as
    ``overview.time_to_stop`` gives them; ``receipts``: the stop receipts written and what
    they add up to (``receipts.RECEIPT_TOTALS``); ``webhook_failures``: failed webhook
    attempts, by ``retry`` and ``gave_up`` (``webhooks.attempt_recorded``)."""
    rows = list(MetricDelta.objects.values_list("name", "key")
                .annotate(total=Sum("value"), n=Count("id"))
                .values_list("name", "key", "total", "n").order_by())
    if sum(n for *_, n in rows) > len(rows) + FOLD_AFTER:
        fold()
    runs, lost, stop, sums = {}, 0, {}, {}
    receipts = dict.fromkeys(RECEIPT_TOTALS, 0)
    webhook_failures = {"retry": 0, "gave_up": 0}
    for name, key, value, _ in rows:
        if name == "runs":
            state, _, end_cause = key.partition("|")
            if round(value):
                runs[(state, end_cause)] = round(value)
        elif name == "lost":
            lost += round(value)
        elif name == "stop":
            path, _, index = key.partition("|")
            counts = stop.setdefault(path, [0] * (len(STOP_BUCKETS) + 1))
            counts[int(index)] += round(value)
        elif name == "stop_sum":
            sums[key] = sums.get(key, 0.0) + value
        elif name in receipts:
            receipts[name] += round(value)
        elif name == WEBHOOK_FAILURES:
            webhook_failures[key] = webhook_failures.get(key, 0) + round(value)
    time_to_stop = []
    for path in sorted(stop):
        counts, cumulative, buckets = stop[path], 0, []
        if not sum(counts):
            continue
        for bound, count in zip(STOP_BUCKETS, counts, strict=False):
            cumulative += count
            buckets.append((str(bound), cumulative))
        buckets.append(("+Inf", sum(counts)))
        time_to_stop.append({"path": path, "count": sum(counts), "sum": sums.get(path, 0.0),
                             "buckets": buckets})
    return {"runs": runs, "lost": lost, "time_to_stop": time_to_stop, "receipts": receipts,
            "webhook_failures": webhook_failures}
