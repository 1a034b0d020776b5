"""GET /api/overview/: the figures of the overview's charts, and the stop health it shares
with /metrics."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runs import domain
from runs.domain import overview as figures
from runs.models import ControlIntent, LiveSample, Run
from tests.factories import OWNER, awaiting_run, queued_run, running_run

pytestmark = pytest.mark.django_db


def ended_run(cause: str, *, seconds: float, ended_ago: timedelta, now=None) -> Run:
    run, generation = running_run()
    ending = domain.Ending.failed("boom") if cause == "failed" else domain.Ending.completed()
    domain.attempt_finish(run_id=run.id, generation=generation, ending=ending)
    ended_at = (now or timezone.now()) - ended_ago
    Run.objects.filter(pk=run.id).update(seconds_used=seconds, ended_at=ended_at,
                                         started_at=ended_at - timedelta(seconds=seconds))
    return Run.objects.get(pk=run.id)


def test_the_overview_counts_live_runs_and_the_window(viewer_client, monkeypatch):
    queued_run()
    running_run()
    awaiting_run()
    now = timezone.now() + timedelta(seconds=5)  # the clock the overview is asked at
    minutes = timedelta(minutes=1)
    for index, seconds in enumerate(range(1, 11)):  # running times 1 to 10 s
        ended_run("failed" if index < 3 else "completed", seconds=float(seconds),
                  ended_ago=minutes * (index % 5 + 1), now=now)
    ended_run("completed", seconds=999.0, ended_ago=timedelta(hours=3))  # outside the hour

    monkeypatch.setattr("django.utils.timezone.now", lambda: now)
    body = viewer_client.get("/api/overview/").json()
    assert (body["window"], body["bucket"], len(body["series"])) == (3600, 60, 60)
    assert body["runs"] == {"queued": 1, "running": 1, "awaiting": 1}
    assert body["ended"] == {"completed": 7, "failed": 3, "cancelled": 0, "stopped": 0}
    assert body["failure_rate"] == pytest.approx(0.3)
    # Interpolated as percentile_cont: 1..10 s.
    assert body["duration"]["count"] == 10
    assert body["duration"]["p50"] == pytest.approx(5.5)
    assert body["duration"]["p95"] == pytest.approx(9.55)
    assert body["duration"]["p99"] == pytest.approx(9.91)
    assert sum(point["ended"] for point in body["series"]) == 10
    # Two runs ended in each of the five minutes before this one.
    assert [point["ended"] for point in body["series"][-6:]] == [2, 2, 2, 2, 2, 0]
    # The ten ended runs and the two live ones that started (the queued one has not).
    assert sum(point["started"] for point in body["series"]) == 12


def test_a_longer_window_has_coarser_buckets(viewer_client):
    ended_run("completed", seconds=5.0, ended_ago=timedelta(hours=3))
    body = viewer_client.get("/api/overview/?window=86400").json()
    assert (body["bucket"], len(body["series"])) == (480, 180)
    assert body["ended"]["completed"] == 1 and body["duration"]["p99"] == 5.0
    points = [point["at"] for point in body["series"]]
    assert points == sorted(points)


def test_no_runs_ended_means_no_rate_and_no_percentiles(viewer_client):
    queued_run()
    body = viewer_client.get("/api/overview/?window=600").json()
    assert body["failure_rate"] is None
    assert body["duration"] == {"count": 0, "p50": None, "p95": None, "p99": None}
    assert body["time_to_stop"] == {} and body["pending_intents"] == 0


def test_time_to_stop_is_the_figure_of_the_metrics(viewer_client):
    durable = queued_run()
    domain.run_cancel(run_id=durable.id, actor="olga", source="api")
    live, generation = running_run()
    domain.run_stop(run_id=live.id, actor="olga", source="api", reason="enough")
    pending, _ = running_run()
    domain.run_cancel(run_id=pending.id, actor="olga", source="api")
    domain.attempt_interrupted(run_id=live.id, generation=generation)

    stop = viewer_client.get("/api/overview/").json()["time_to_stop"]
    assert set(stop) == {"durable", "live"}
    assert (stop["durable"]["count"], stop["live"]["count"]) == (1, 1)
    assert stop["live"]["buckets"][-1] == ["+Inf", 1]
    assert viewer_client.get("/api/overview/").json()["pending_intents"] == 1

    metrics = Client().get("/metrics").content.decode()
    for path, figures_ in stop.items():
        count = re.search(rf'awaken_time_to_stop_seconds_count{{path="{path}"}} (\S+)', metrics)
        total = re.search(rf'awaken_time_to_stop_seconds_sum{{path="{path}"}} (\S+)', metrics)
        assert float(count.group(1)) == figures_["count"]
        assert float(total.group(1)) == pytest.approx(figures_["sum"])
        for bound, cumulative in figures_["buckets"]:
            line = f'awaken_time_to_stop_seconds_bucket{{le="{bound}",path="{path}"}} '
            assert f"{line}{float(cumulative)}" in metrics


def test_a_request_applied_before_the_window_is_left_out():
    run = queued_run()
    domain.run_cancel(run_id=run.id, actor="olga", source="api")
    ControlIntent.objects.update(applied_at=timezone.now() - timedelta(hours=2))
    assert figures.overview(window=3600)["time_to_stop"] == {}
    assert [row["count"] for row in figures.time_to_stop()] == [1]


def test_the_overview_costs_the_same_few_queries_however_many_runs(
        viewer_client, django_assert_max_num_queries):
    for _ in range(30):
        ended_run("completed", seconds=1.0, ended_ago=timedelta(minutes=3))
        domain.attempt_start(run_id=queued_run().id, owner=OWNER, lease_seconds=30)
    with django_assert_max_num_queries(12):
        assert viewer_client.get("/api/overview/").status_code == 200


@pytest.mark.parametrize("window", ["59", "604801", "an-hour", "-5"])
def test_a_bad_window_is_a_400(viewer_client, window):
    response = viewer_client.get(f"/api/overview/?window={window}")
    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert "window" in response.json()["detail"]


def test_percentile_interpolates_between_neighbours():
    assert figures.percentile([], 0.5) is None
    assert figures.percentile([4.0], 0.99) == 4.0
    assert figures.percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5


def minute(at):
    return at.replace(second=0, microsecond=0)


def test_live_runs_by_state_have_a_history_from_the_samples(viewer_client, monkeypatch):
    """The chart's history is there when the page opens: each bucket is the highest of
    its minutes sampled, a minute nobody sampled is null, and the last point is now."""
    now = minute(timezone.now()) + timedelta(seconds=30)
    monkeypatch.setattr("django.utils.timezone.now", lambda: now)
    queued_run()
    running_run()
    samples = {10: (1, 2, 0), 9: (0, 5, 1), 3: (2, 0, 0), 90: (7, 7, 7)}  # minutes ago
    for ago, (queued, running, awaiting) in samples.items():
        LiveSample.objects.create(at=minute(now) - timedelta(minutes=ago), queued=queued,
                                  running=running, awaiting=awaiting)
    body = viewer_client.get("/api/overview/").json()
    assert body["sample_seconds"] == 60
    history = body["live_series"]
    assert len(history) == len(body["series"]) + 1  # the buckets, then now
    by_minute = {point["at"]: point for point in history[:-1]}
    at = (minute(now) - timedelta(minutes=10)).isoformat().replace("+00:00", "Z")
    assert by_minute[at] == {"at": at, "queued": 1, "running": 2, "awaiting": 0}
    # Ten minutes ago to one minute ago:
    assert [p["running"] for p in history[-12:-2]] == [2, 5, None, None, None, None, None,
                                                       0, None, None]
    assert history[-1]["queued"] == 1 and history[-1]["running"] == 1  # now, as the cards
    # Outside the hour, the 90-minute-old sample is left out; a longer range takes it in,
    # the highest of a coarser bucket's samples.
    assert all(p["queued"] != 7 for p in history)
    wide = viewer_client.get("/api/overview/?window=86400").json()
    assert wide["bucket"] == 480
    highest = {}
    for ago, (_, running, _) in samples.items():
        at = minute(now) - timedelta(minutes=ago)
        start = datetime.fromtimestamp(int(at.timestamp()) // 480 * 480, tz=UTC)
        highest[start] = max(highest.get(start, 0), running)
    drawn = {datetime.fromisoformat(p["at"]): p["running"] for p in wide["live_series"][:-1]
             if p["running"] is not None}
    assert drawn == highest


def test_the_sweeper_samples_live_runs_once_a_minute_and_keeps_eight_days(monkeypatch):
    queued_run()
    running_run()
    now = minute(timezone.now()) + timedelta(seconds=5)
    LiveSample.objects.create(at=minute(now) - figures.SAMPLES_KEPT - timedelta(minutes=1),
                              queued=0, running=0, awaiting=0)
    kept = LiveSample.objects.create(at=minute(now) - figures.SAMPLES_KEPT,
                                     queued=0, running=0, awaiting=0)
    monkeypatch.setattr("django.utils.timezone.now", lambda: now)
    domain.sweep()
    assert figures.record_live_sample(now=now + timedelta(seconds=20)) is False  # same minute
    sample = LiveSample.objects.get(at=minute(now))
    assert (sample.queued, sample.running, sample.awaiting) == (1, 1, 0)
    assert list(LiveSample.objects.values_list("pk", flat=True)) == [kept.pk, sample.pk]
    assert figures.record_live_sample(now=now + timedelta(minutes=1)) is True
    # A minute on, the oldest kept one is older than eight days, and goes.
    assert list(LiveSample.objects.values_list("at", flat=True)) == [
        minute(now), minute(now) + timedelta(minutes=1)]


def test_the_figures_by_agent(viewer_client):
    queued_run(agent="demo.hang")
    live, _ = running_run(agent="demo.steps")
    ended_run("failed", seconds=2.0, ended_ago=timedelta(minutes=2))  # demo.steps
    stopped, generation = running_run(agent="demo.hang")
    domain.run_stop(run_id=stopped.id, actor="olga", source="api", reason="enough")
    domain.attempt_interrupted(run_id=stopped.id, generation=generation)
    cancelled = queued_run(agent="demo.hang")
    domain.run_cancel(run_id=cancelled.id, actor="olga", source="api")
    agents = {row["agent"]: row for row in viewer_client.get("/api/overview/").json()["agents"]}
    assert list(agents) == ["demo.hang", "demo.steps"]
    hang, steps = agents["demo.hang"], agents["demo.steps"]
    assert hang["live"] == {"queued": 1, "running": 0, "awaiting": 0}
    assert hang["ended"] == {"completed": 0, "failed": 0, "cancelled": 1, "stopped": 1}
    assert hang["failure_rate"] == 0
    assert hang["time_to_stop"]["count"] == 2
    assert 0 <= hang["time_to_stop"]["mean"] <= hang["time_to_stop"]["max"] < 60
    assert steps["live"]["running"] == 1 and steps["ended"]["failed"] == 1
    assert steps["failure_rate"] == 1.0
    assert steps["time_to_stop"] == {"count": 0, "mean": None, "max": None}


def test_a_range_from_since_to_until(viewer_client):
    now = timezone.now()
    ended_run("completed", seconds=1.0, ended_ago=timedelta(hours=5), now=now)
    ended_run("failed", seconds=1.0, ended_ago=timedelta(hours=2), now=now)
    since, until = now - timedelta(hours=6), now - timedelta(hours=3)
    body = viewer_client.get("/api/overview/", {"since": since.isoformat(),
                                                "until": until.isoformat()}).json()
    assert body["window"] == 3 * 3600 and body["bucket"] == 60
    assert body["ended"] == {"completed": 1, "failed": 0, "cancelled": 0, "stopped": 0}
    assert len(body["live_series"]) == len(body["series"])  # no "now" point in the past
    assert (datetime.fromisoformat(body["until"]) - until).total_seconds() == 0
    # In whole minutes, as a window: the first starts within a minute of the start asked.
    assert 0 <= (datetime.fromisoformat(body["since"]) - since).total_seconds() < 60
    # A start alone runs to now.
    body = viewer_client.get("/api/overview/", {"since": since.isoformat()}).json()
    assert body["window"] >= 6 * 3600 and body["ended"]["failed"] == 1


@pytest.mark.parametrize("asked, words", [
    ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "before its end"),
    ({"since": "2026-01-01T00:00:00Z", "until": "2026-01-09T00:00:01Z"}, "7 days"),
    ({"since": "2026-01-01T00:00:00Z", "until": "2026-01-01T00:00:30Z"}, "60 s"),
    ({"since": "2026-01-01T00:00:00Z", "window": "3600"}, "not both"),
    ({"since": "2026-01-01T00:00:00"}, "UTC offset"),
    ({"since": "0001-01-01T00:00:00Z", "until": "0001-01-01T01:00:00Z"}, "no run is that old"),
])
def test_a_bad_range_is_a_400_that_says_why(viewer_client, asked, words):
    response = viewer_client.get("/api/overview/", asked)
    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    assert words in response.json()["detail"]


def test_seven_days_is_the_longest_window(viewer_client):
    body = viewer_client.get("/api/overview/?window=604800").json()
    assert (body["bucket"], len(body["series"]), len(body["live_series"])) == (3360, 180, 181)
