"""What a run's lifecycle asks of the database, folded as docs/performance.md says: the
create is its one statement in autocommit, the claim reads whether its worker is drained
in the statement that locks the runs, a cancel's request is one statement after the run's
lock, and an ended run's transition reads whether a webhook endpoint is active in its own
statement. Each with the behaviour it must keep."""

import threading

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from harness.processes import wait_until
from runs import domain, tasks
from runs.domain import Ending
from runs.domain.errors import WorkerDraining
from runs.models import Event, Run, RunState, WebhookDelivery, WebhookEndpoint
from runs.runtime.executor import Executor
from tests.conftest import db_state, make_user
from tests.factories import queued_run, running_run

ENDPOINTS = '"runs_webhookendpoint"'
WORKERS = '"runs_workerprocess"'


def statements(queries) -> list[str]:
    return [q["sql"] for q in queries.captured_queries]


def in_another_connection(fn):
    """``fn()`` in a thread of its own, so on a database connection of its own (committed
    there before this returns); its result."""
    result = []

    def target():
        try:
            result.append(fn())
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and result, "the other connection's work did not finish"
    return result[0]


@pytest.fixture
def sent(monkeypatch):
    """The runs handed to workers (``runs_queued``), each with whether another connection
    could see it committed at that moment (on PostgreSQL; else None)."""
    handed = []

    def runs_queued(runs):
        ids = [run_id for run_id, _ in runs]
        seen = (in_another_connection(lambda: Run.objects.filter(pk__in=ids).count())
                if connection.vendor == "postgresql" else None)
        handed.append((ids, seen))

    monkeypatch.setattr("runs.workers.dispatch.runs_queued", runs_queued)
    return handed


# --- the create --------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_create_is_its_one_statement_with_no_begin_or_commit_then_its_dispatch(sent):
    with CaptureQueriesContext(connection) as queries:
        run, created = domain.run_create(agent="demo.steps")
    assert created
    [statement] = statements(queries)  # no SAVEPOINT, no COMMIT: autocommit
    assert statement.startswith("WITH ") and '"runs_event"' in statement
    assert sent == [([run.id], 1)]  # committed by the time it is dispatched

    with CaptureQueriesContext(connection) as queries:
        made = domain.runs_create(runs=[{"agent": "demo.steps"}, {"agent": "demo.fail"}])
    assert len(statements(queries)) == 1
    assert sent[1] == ([r.id for r in made], 2)
    assert Event.objects.filter(run__in=[r.id for r in made], kind="created").count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_failed_create_writes_nothing_and_dispatches_nothing(sent):
    ghost = User(pk=987654, username="ghost")  # no such user: the runs' key is refused
    before = db_state()
    with pytest.raises(IntegrityError):
        domain.run_create(agent="demo.steps", created_by=ghost)
    with pytest.raises(IntegrityError):
        domain.runs_create(runs=[{"agent": "demo.steps"}, {"agent": "demo.fail"}],
                           created_by=ghost)
    with pytest.raises(IntegrityError):  # a key does not make a refused insert a replay
        domain.run_create(agent="demo.steps", created_by=ghost, idempotency_key="k")
    assert db_state() == before and sent == []
    run, created = domain.run_create(agent="demo.steps")  # the connection is still usable
    assert created and sent == [([run.id], 1 if connection.vendor == "postgresql" else None)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_create_in_a_callers_transaction_replays_a_key_and_dispatches_at_its_commit(sent):
    operator = make_user("olga", "operator")
    with transaction.atomic():
        first, created = domain.run_create(agent="demo.steps", created_by=operator,
                                           idempotency_key="k")
        again, created_again = domain.run_create(agent="demo.steps", created_by=operator,
                                                 idempotency_key="k")
        assert (created, created_again, again.id) == (True, False, first.id)
        assert Run.objects.count() == 1  # the refused insert left the transaction usable
        assert sent == []
    assert sent == [([first.id], 1)]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_with_one_key_make_one_run_and_dispatch_it_once(sent):
    operator = make_user("olga", "operator")
    barrier = threading.Barrier(4)

    def create():
        barrier.wait(10)
        try:
            return domain.run_create(agent="demo.steps", created_by=operator,
                                     idempotency_key="same")
        finally:
            connections.close_all()

    results = []
    threads = [threading.Thread(target=lambda: results.append(create())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 4
    assert len({run.id for run, _ in results}) == 1
    assert sorted(created for _, created in results) == [False, False, False, True]
    assert Run.objects.count() == 1
    assert [ids for ids, _ in sent] == [[results[0][0].id]]


# --- the claim ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_drained_worker_claims_none_and_a_childs_claim_goes_on():
    run, child = queued_run(), queued_run()
    domain.worker_report(owner="folds:1", live_attempts=0, abandoned_tools=0)
    domain.worker_drain(name="folds:1", draining=True, actor="olga")
    before = db_state()
    with pytest.raises(WorkerDraining):
        domain.attempts_start(run_ids=[run.id], owner="folds:1", lease_seconds=30,
                              unless_draining=True)
    assert db_state() == before
    assert domain.attempts_start(run_ids=[child.id], owner="folds:1", lease_seconds=30)
    domain.worker_drain(name="folds:1", draining=False, actor="olga")
    [attempt] = domain.attempts_start(run_ids=[run.id], owner="folds:1", lease_seconds=30,
                                      unless_draining=True)
    assert attempt.run_id == run.id and Run.objects.get(pk=run.id).state == RunState.RUNNING
    # Nothing to lock (no such run, none left queued): nothing claimed, nothing asked.
    assert domain.attempts_start(run_ids=["nope"], owner="folds:1", lease_seconds=30,
                                 unless_draining=True) == []


class Retried(Exception):
    pass


@pytest.fixture
def task(monkeypatch):
    """``tasks.execute`` on the executor given, its message's returns raised as Retried."""
    def retry(*, args, countdown):
        raise Retried(args)

    monkeypatch.setattr(tasks.execute, "retry", retry)

    def on(executor):
        monkeypatch.setattr(tasks, "get_executor", lambda node: executor)
        return tasks.execute
    return on


def test_a_full_worker_sends_no_statement_and_its_message_goes_back_whole(task):
    class Full:
        owner, room = "folds:1", 0

        def start(self, run_ids):
            raise AssertionError("a full worker claims nothing")

    # No django_db mark: a statement would be refused, so none is sent.
    with pytest.raises(Retried) as retried:
        task(Full())(["a", "b"])
    assert retried.value.args == ([["a", "b"]],)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_claim_reads_the_drain_in_its_locking_statement_and_a_drained_one_returns(
        task, monkeypatch):
    monkeypatch.setattr("runs.workers.dispatch.runs_queued", lambda **kwargs: None)
    executor = Executor(node="folds", lease_seconds=3600, db_threads=2)
    try:
        domain.worker_report(owner=executor.owner, live_attempts=0, abandoned_tools=0)
        domain.worker_drain(name=executor.owner, draining=True, actor="olga")
        run = queued_run()
        with CaptureQueriesContext(connection) as queries, pytest.raises(Retried) as retried:
            task(executor)([str(run.id)])
        assert retried.value.args == ([[str(run.id)]],)
        begin, locking, rollback = statements(queries)  # one statement, nothing written
        assert (begin, rollback) == ("BEGIN", "ROLLBACK")
        assert WORKERS in locking and "FOR NO KEY UPDATE" in locking
        assert Run.objects.get(pk=run.id).state == RunState.QUEUED

        domain.worker_drain(name=executor.owner, draining=False, actor="olga")
        with CaptureQueriesContext(connection) as queries:
            task(executor)([str(run.id)])
        sent = statements(queries)
        claim = sent[:sent.index("COMMIT") + 1]
        assert claim[0] == "BEGIN" and len(claim) == 4  # the lock, then the writes
        assert "FOR NO KEY UPDATE" in claim[1] and claim[2].startswith("WITH ")
        assert [s for s in sent if WORKERS in s] == claim[1:2]  # no read of its own
        assert not any(ENDPOINTS in s for s in sent)
        wait_until(lambda: Run.objects.get(pk=run.id).state == RunState.ENDED, 20,
                   "the claimed run to end")
    finally:
        executor.close()


# --- a cancel's request -------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_cancel_of_a_running_run_is_its_lock_and_one_statement_that_names_the_new_request():
    run, _ = running_run()  # the test's transaction never commits: nothing is sent
    with CaptureQueriesContext(connection) as queries:
        result = domain.run_cancel(run_id=run.id, actor="olga", source="api")
    lock, written = [s for s in statements(queries) if "SAVEPOINT" not in s
                     and not s.startswith(("BEGIN", "COMMIT", "RELEASE"))]
    assert "FOR NO KEY UPDATE" in lock
    assert '"runs_controlintent"' in written and '"runs_event"' in written
    stored = Run.objects.get(pk=run.id)
    assert (result.path, stored.control_id, stored.control.applied_at) == (
        "live", result.intent.pk, None)
    assert result.run.control_id == result.intent.pk  # as committed, on the answer's run
    assert stored.events.get(version=stored.version).kind == "cancel_requested"


# --- the end: whether a webhook endpoint is active ---------------------------------------


def endpoint(**values) -> WebhookEndpoint:
    user = User.objects.filter(username="olga").first() or make_user("olga", "operator")
    return WebhookEndpoint.objects.create(url="https://hooks.example.com/h", secret="s",
                                          created_by=user, **{"events": ["run.ended"],
                                                              **values})


@pytest.mark.postgres
@pytest.mark.django_db
def test_an_end_reads_whether_an_endpoint_is_active_in_its_own_statement():
    run, generation = running_run()
    with CaptureQueriesContext(connection) as queries:
        assert domain.attempt_finish(run_id=run.id, generation=generation,
                                     ending=Ending.completed())
    asked = [s for s in statements(queries) if ENDPOINTS in s]
    assert len(asked) == 1 and asked[0].startswith("WITH ") and '"runs_event"' in asked[0]
    assert not WebhookDelivery.objects.exists()
    # A step is not told of: its statement does not ask.
    run, generation = running_run()
    with CaptureQueriesContext(connection) as queries:
        domain.attempt_step(run_id=run.id, generation=generation)
    assert not any(ENDPOINTS in s for s in statements(queries))


@pytest.mark.django_db(transaction=True)
def test_an_endpoint_made_just_before_a_run_ends_gets_its_delivery():
    ended_unseen, generation = running_run()
    assert domain.attempt_finish(run_id=ended_unseen.id, generation=generation,
                                 ending=Ending.completed())
    run, generation = running_run()
    awaited, awaited_generation = running_run()
    if connection.vendor == "postgresql":  # made and committed by another process's
        made = in_another_connection(lambda: endpoint(events=["run.ended", "run.awaiting"]))
    else:
        made = endpoint(events=["run.ended", "run.awaiting"])
    assert domain.attempt_finish(run_id=run.id, generation=generation,
                                 ending=Ending.completed())
    assert list(WebhookDelivery.objects.values_list("endpoint", "type")) == [
        (made.pk, "run.ended")]
    domain.attempt_pause(run_id=awaited.id, generation=awaited_generation)
    assert WebhookDelivery.objects.filter(endpoint=made, type="run.awaiting").count() == 1

    WebhookEndpoint.objects.filter(pk=made.pk).update(active=False)
    other, generation = running_run()
    assert domain.attempt_finish(run_id=other.id, generation=generation,
                                 ending=Ending.completed())
    assert WebhookDelivery.objects.count() == 2  # none for an inactive endpoint
    WebhookEndpoint.objects.filter(pk=made.pk).update(active=True)
    last, generation = running_run()
    assert domain.attempt_finish(run_id=last.id, generation=generation,
                                 ending=Ending.completed())
    assert WebhookDelivery.objects.filter(type="run.ended").count() == 2


# --- the last step and the end -------------------------------------------------------------


class Changes:
    """The changes the transitions publish after commit (``outside.changes``)."""

    def __init__(self):
        self.sent = []

    def publish_changes(self, *, changes):
        self.sent += [(event.kind, event.seq, run.state, run.steps, run.tokens, run.version,
                       run.updated_at) for run, event in changes]

    def publish_activity(self, *, run_id, entries):
        pass


def ended_with_its_last_step(together: bool, capture) -> tuple[Run, list, list]:
    """A run whose last step (with an activity entry) is written with its end, or (not
    ``together``) in a transaction before it: the run, its events and the statements of
    the end."""
    run, generation = running_run()
    step = {"tokens": 7, "agent_state": {"at": "ü"}, "data": {"note": "last"}}
    entry = [{"kind": "log", "text": "before the step"}]
    if not together:
        with capture(execute=True):
            domain.attempt_step(run_id=run.id, generation=generation, activity=entry, **step)
    with CaptureQueriesContext(connection) as queries, capture(execute=True):
        assert domain.attempt_finish(
            run_id=run.id, generation=generation, ending=Ending.completed({"answer": 42}),
            **({"step": step, "activity": entry} if together else {}))
    events = list(Event.objects.filter(run=run).order_by("seq")
                  .values_list("kind", "version", "state", "data"))
    return Run.objects.get(pk=run.id), events, statements(queries)


@pytest.mark.django_db
def test_a_last_step_and_the_end_are_one_statement_that_writes_what_two_would(
        monkeypatch, django_capture_on_commit_callbacks):
    changes = Changes()
    monkeypatch.setattr("runs.domain.outside.changes", changes)
    apart, apart_events, _ = ended_with_its_last_step(False, django_capture_on_commit_callbacks)
    published_apart, changes.sent = changes.sent, []
    run, events, sent = ended_with_its_last_step(True, django_capture_on_commit_callbacks)

    assert events == apart_events
    assert [kind for kind, *_ in events][-2:] == ["step", "ended"]
    fields = ("state", "end_cause", "output", "steps", "tokens", "agent_state", "version",
              "activity_last", "activity_agent", "activity_apart")
    assert ([getattr(run, name) for name in fields]
            == [getattr(apart, name) for name in fields])
    assert run.activity.count() == apart.activity.count() == 1
    # The step's change shows the run as the step left it, the end's as the end did, in
    # the order of their events.
    def shown(published):  # what each change shows of the run, but its seq and time
        return [(change[0], *change[2:6]) for change in published[-2:]]

    assert shown(changes.sent) == shown(published_apart)
    step_change, end_change = changes.sent[-2:]
    assert step_change[0] == "step" and end_change[0] == "ended"
    assert step_change[2:6] == ("running", 1, 7, apart.version - 1)
    assert end_change[2:6] == ("ended", 1, 7, apart.version)
    assert step_change[1] < end_change[1]
    assert step_change[6] is not None and step_change[6] <= end_change[6]
    if connection.vendor == "postgresql":
        writes = [s for s in sent if s.startswith("WITH ")]
        assert len(writes) == 1 and writes[0].count('UPDATE "runs_run"') == 1


# --- planned once ------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_claim_and_the_end_are_planned_while_a_connection_warms_up_and_then_never():
    """psycopg prepares a statement on a connection's fifth run of it, and PostgreSQL
    plans the first five executions of a prepared statement for their values. After that
    it keeps one plan for any values, unless that plan is estimated dearer than plans made
    for the values: then it plans every execution. A write whose cheap plan needs a
    parameter's value (a partial index's condition, say) is planned at every run, which
    for the end's statement is once per lifecycle."""
    old = queued_run()  # a history of attempts, so that the planner's figures are not nil
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO runs_attempt (run_id, generation, state, close_reason, "
                       "owner, lease_expires_at, started_at, closed_at) SELECT %s, n, "
                       "'closed', 'lost', 'w', now(), now(), now() "
                       "FROM generate_series(1, 5000) AS n", [old.id])
        cursor.execute("ANALYZE runs_attempt")
    entry = [{"kind": "log", "text": "a line"}]
    for _ in range(15):
        run = queued_run()
        [attempt] = domain.attempts_start(run_ids=[run.id], owner="plans:1", lease_seconds=30)
        assert domain.attempt_finish(run_id=run.id, generation=attempt.generation,
                                     ending=Ending.completed({"n": 1}), activity=entry,
                                     step={"tokens": 1, "agent_state": {}, "data": {}})
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans "
                       "FROM pg_prepared_statements WHERE statement LIKE 'WITH %%'")
        plans = {("claim" if '"runs_attempt" ("run_id"' in text else "end"): (generic, custom)
                 for text, generic, custom in cursor.fetchall()
                 if '"runs_attempt"' in text and '"runs_event"' in text}
    assert set(plans) == {"claim", "end"}
    for generic, custom in plans.values():
        assert custom <= 5 and generic >= 3  # 15 runs: at most 4 + 5 planned
