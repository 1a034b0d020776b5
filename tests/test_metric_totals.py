"""The totals of /metrics that the database keeps as changes commit (runs.domain.totals)
equal, after every kind of transition, what a count of the whole tables gives."""

import importlib
import random
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from runs import domain
from runs.domain.core import Ending
from runs.domain.overview import time_to_stop
from runs.domain.totals import fold, totals
from runs.models import (
    STOP_BUCKETS,
    Attempt,
    CloseReason,
    ControlIntent,
    MetricDelta,
    Run,
    RunState,
)
from tests.factories import OWNER, awaiting_run, queued_run, running_run

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_worker_takes_the_runs(monkeypatch):
    monkeypatch.setattr("runs.workers.dispatch.runs_queued", lambda **kwargs: None)


def counted() -> dict:
    """The totals as the whole tables give them (what /metrics read before)."""
    runs = {(row["state"], row["end_cause"] or ""): row["n"] for row in
            Run.objects.values("state", "end_cause").annotate(n=Count("pk")).order_by()}
    lost = Attempt.objects.filter(close_reason=CloseReason.LOST).count()
    return {"runs": runs, "lost": lost, "time_to_stop": time_to_stop()}


def assert_totals_match():
    kept, whole = totals(), counted()
    assert kept["runs"] == whole["runs"]
    assert kept["lost"] == whole["lost"]
    assert [(r["path"], r["count"], r["buckets"]) for r in kept["time_to_stop"]] == \
        [(r["path"], r["count"], r["buckets"]) for r in whole["time_to_stop"]]
    for mine, theirs in zip(kept["time_to_stop"], whole["time_to_stop"], strict=True):
        assert mine["sum"] == pytest.approx(theirs["sum"], abs=1e-6)


def expire(run_id) -> None:
    """Let the live attempt's lease run out, as a frozen worker's would."""
    Attempt.objects.filter(run_id=run_id, state="live").update(
        lease_expires_at=timezone.now() - timedelta(seconds=60))


def test_every_transition_path_keeps_the_totals_equal_to_a_count_of_the_tables():
    assert_totals_match()
    # Created one by one, in a batch, again; claimed, stepped, completed, failed.
    run, generation = running_run()
    domain.attempt_step(run_id=run.id, generation=generation, tokens=3)
    assert_totals_match()
    domain.attempt_finish(run_id=run.id, generation=generation,
                            ending=Ending.completed({"ok": True}))
    domain.runs_create(runs=[{"agent": "demo.steps"}, {"agent": "demo.steps"}])
    domain.run_rerun(run_id=run.id)
    failing, generation = running_run()
    domain.attempt_finish(run_id=failing.id, generation=generation,
                            ending=Ending.failed("boom"))
    assert_totals_match()

    # Cancel and stop, by the durable path (queued, awaiting) and the live one (running).
    domain.run_cancel(run_id=queued_run().id, actor="op", source="api")
    awaiting, _ = awaiting_run()
    domain.run_stop(run_id=awaiting.id, actor="op", source="api", reason="enough")
    running, generation = running_run()
    domain.run_cancel(run_id=running.id, actor="op", source="api")
    assert_totals_match()  # an intent pending: nothing applied yet
    domain.attempt_interrupted(run_id=running.id, generation=generation,
                                 accepted_at=timezone.now())
    assert_totals_match()

    # Pause, resume, a policy stop; a parent ending with its children.
    paused, ticket = awaiting_run()
    domain.run_resume(run_id=paused.id, ticket_id=ticket, actor="op", source="api")
    over, generation = running_run()
    domain.attempt_stop_by_policy(run_id=over.id, generation=generation, code="max_steps",
                                    reason="Step budget reached.")
    parent, generation = running_run()
    child = queued_run(parent_id=parent.id)
    running_child = running_run(parent_id=parent.id)[0]
    domain.attempt_finish(run_id=parent.id, generation=generation, ending=Ending.completed())
    assert Run.objects.get(pk=child.id).state == RunState.ENDED
    assert ControlIntent.objects.filter(run_id=running_child.id, applied_at=None).exists()
    assert_totals_match()

    # The sweeper: a lost attempt requeued, one past its retries failed, one whose pending
    # cancel it applies.
    for retries, cancel in ((0, False), (99, False), (0, True)):
        lost, generation = running_run()
        Run.objects.filter(pk=lost.id).update(crash_retries=retries)
        if cancel:
            domain.run_cancel(run_id=lost.id, actor="op", source="api")
        expire(lost.id)
        assert domain.attempt_expire(run_id=lost.id, generation=generation,
                                       max_crash_retries=3) is not None
        if retries == 99:
            lost_without_intent = lost.id
    assert Attempt.objects.filter(close_reason=CloseReason.LOST).count() == 3
    assert_totals_match()

    # History brought in bulk, and a run deleted with its attempts (one lost among them).
    domain.runs_import(agent="demo.steps", count=25)
    domain.runs_import(agent="demo.steps", count=5, ended=False)
    assert_totals_match()
    Run.objects.filter(pk=lost_without_intent).delete()
    assert Attempt.objects.filter(close_reason=CloseReason.LOST).count() == 2
    assert_totals_match()


def test_the_installed_triggers_bucket_times_by_the_bounds_of_stop_buckets():
    """The triggers were built from STOP_BUCKETS when their migration ran: a change to the
    bounds without a migration that installs them again fails here."""
    took = [bound + extra for bound in STOP_BUCKETS for extra in (0.0, 0.0004)]
    for seconds in [*took, STOP_BUCKETS[-1] * 2]:
        run, _ = awaiting_run()  # no worker claims it: each cancel takes the durable path
        domain.run_cancel(run_id=run.id, actor="op", source="api")
        intent = ControlIntent.objects.get(run_id=run.id)
        ControlIntent.objects.filter(pk=intent.pk).update(
            applied_at=intent.requested_at + timedelta(seconds=seconds))
    kept = {row["path"]: row["buckets"] for row in totals()["time_to_stop"]}
    (path, buckets), = kept.items()
    assert [bound for bound, _ in buckets] == [*map(str, STOP_BUCKETS), "+Inf"]
    assert [count for _, count in buckets] == [
        sum(1 for seconds in took if seconds <= bound) for bound in STOP_BUCKETS
    ] + [len(took) + 1]
    assert_totals_match()


def test_a_fold_leaves_one_row_per_total_and_the_totals_as_they_were():
    for _ in range(5):
        run, generation = running_run()
        domain.attempt_finish(run_id=run.id, generation=generation, ending=Ending.completed())
    domain.run_cancel(run_id=queued_run().id, actor="op", source="api")
    assert MetricDelta.objects.count() > 10
    first = totals()
    fold()
    keys = set(MetricDelta.objects.values_list("name", "key"))
    assert MetricDelta.objects.count() == len(keys) <= 4  # two runs totals, stop, stop_sum
    assert totals() == first


def test_a_read_folds_once_enough_changes_came(monkeypatch):
    monkeypatch.setattr("runs.domain.totals.FOLD_AFTER", 10)
    for _ in range(3):
        queued_run()
    totals()
    assert MetricDelta.objects.count() == 3  # not yet: 3 changes
    for _ in range(10):
        queued_run()
    first = totals()  # folds, for the next read
    assert MetricDelta.objects.count() == 1
    assert totals() == first and first["runs"] == {("queued", ""): 13}


def test_the_migration_counts_what_the_tables_held_before_its_triggers():
    """Its seed statements, run on tables that already hold rows, give what the triggers
    gave for them."""
    for _ in range(3):
        run, generation = running_run()
        domain.attempt_finish(run_id=run.id, generation=generation, ending=Ending.completed())
    domain.run_cancel(run_id=queued_run().id, actor="op", source="api")
    lost, generation = running_run()
    expire(lost.id)
    domain.attempt_expire(run_id=lost.id, generation=generation, max_crash_retries=3)
    kept = totals()
    migration = importlib.import_module("runs.migrations.0017_metric_totals")
    took = (migration.pg_took("r") if connection.vendor == "postgresql"
            else migration.sqlite_took("r"))
    MetricDelta.objects.all().delete()
    with connection.cursor() as cursor:
        for statement in migration.seed(took):
            cursor.execute(statement)
    again = totals()
    assert again["runs"] == kept["runs"] and again["lost"] == kept["lost"] == 1
    assert [r["buckets"] for r in again["time_to_stop"]] == \
        [r["buckets"] for r in kept["time_to_stop"]]


def test_the_metrics_page_serves_the_kept_totals(client):
    run, generation = running_run()
    domain.attempt_finish(run_id=run.id, generation=generation, ending=Ending.completed())
    domain.run_cancel(run_id=queued_run().id, actor="op", source="api")
    text = client.get("/metrics").content.decode()
    assert 'awaken_runs{end_cause="completed",state="ended"} 1.0' in text
    assert 'awaken_runs{end_cause="cancelled",state="ended"} 1.0' in text
    assert 'awaken_time_to_stop_seconds_count{path="durable"} 1.0' in text


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_racing_transitions_and_reads_keep_the_totals_exact(gang):
    """Eight threads finish, cancel, stop, expire and fold the totals at once, over and
    over: no change is lost or counted twice."""
    threads = gang(8)
    rng = random.Random(14)
    for _ in range(40):
        run, generation = running_run()
        other = queued_run()

        def lose(run_id=run.id, generation=generation):
            expire(run_id)
            return domain.attempt_expire(run_id=run_id, generation=generation,
                                           max_crash_retries=0)

        ops = [lambda r=run, g=generation: domain.attempt_finish(
                   run_id=r.id, generation=g, ending=Ending.completed()),
               lambda r=run: domain.run_cancel(run_id=r.id, actor="c", source="api"),
               lambda r=run: domain.run_stop(run_id=r.id, actor="s", source="api",
                                               reason="halt"),
               lose,
               lambda o=other: domain.run_cancel(run_id=o.id, actor="c", source="api"),
               lambda o=other: domain.attempt_start(run_id=o.id, owner=OWNER,
                                                      lease_seconds=30),
               fold, fold]
        rng.shuffle(ops)
        results = threads.run(ops)
        errors = [r for r in results if isinstance(r, Exception)]
        assert not errors, errors
    assert_totals_match()
