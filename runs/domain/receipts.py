"""Stop receipts: what an attempt did after a cancel or stop of its run was asked for.

When the attempt of a running run ends on a cancel or a stop, it hands the finish boundary a
``Trace`` of what it saw: its provider connections (opened and closed), the arrival times of
the streamed chunks, the tool calls still in flight and the tool calls its host refused. The
boundary turns it into the receipt kept with the control intent, measured from the moment
the request was committed (or, for a policy the attempt applies itself, the moment the
attempt decided it), and counts it on /metrics.
"""

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class Trace:
    connections: Sequence[tuple[float, float | None]] = ()  # (opened, closed), unix seconds
    chunk_times: Sequence[float] = ()  # unix seconds, in order of arrival
    tools_in_flight: Sequence[dict] = ()  # {"tool": name, "digest": action digest}
    tools_refused: int = 0
    stopped_at: float | None = None  # when the attempt's token was cancelled


def receipt(trace: Trace, requested_at: datetime) -> dict:
    """The receipt of the stop asked at ``requested_at``, as the run JSON shows it."""
    since = requested_at.timestamp()
    if trace.stopped_at is not None:
        since = min(since, trace.stopped_at)
    closes = [closed for opened, closed in trace.connections
              if closed is not None and closed >= since]
    return {
        "provider_closed_at": (datetime.fromtimestamp(max(closes), UTC).isoformat()
                               .replace("+00:00", "Z") if closes else None),
        "tokens_after_request": len(trace.chunk_times) - bisect_right(trace.chunk_times, since),
        "tool_calls_in_flight": [{"tool": str(call["tool"]), "digest": str(call["digest"])}
                                 for call in trace.tools_in_flight],
        "tool_calls_refused": int(trace.tools_refused),
    }


# The /metrics totals a receipt adds to (``runs.domain.totals``), by MetricDelta name.
RECEIPT_TOTALS = {"receipts": lambda r: 1,
                  "late_tokens": lambda r: r["tokens_after_request"],
                  "tools_in_flight": lambda r: len(r["tool_calls_in_flight"]),
                  "tools_refused": lambda r: r["tool_calls_refused"]}


def receipt_totals(written: dict) -> tuple:
    """What ``written`` adds to the totals: new ``MetricDelta`` rows (``sql.new``), for the
    finish boundary to insert in the statement that writes the receipt."""
    from runs.domain import sql
    from runs.models import MetricDelta

    return tuple(sql.new(MetricDelta, name=name, key="", value=of(written))
                 for name, of in RECEIPT_TOTALS.items() if of(written))
