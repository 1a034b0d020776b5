"""The hand-written reads of the control path (``selectors.run_get``, ``claim_holds``,
``core.pending_intent``, ``keys.key_lookup``) give what their querysets give, with each
call's own values."""

import threading
import uuid

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import domain
from runs.domain import core, keys, selectors
from runs.models import ControlIntent, Run
from tests.conftest import make_user
from tests.factories import awaiting_run, queued_run, running_run

pytestmark = pytest.mark.django_db(transaction=True)


def fields_of(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def test_a_run_is_read_as_the_queryset_reads_it_with_its_ticket_and_request():
    run, _ = awaiting_run()
    domain.run_cancel(run_id=queued_run().pk, actor="t", source="api")
    running, generation = running_run()
    domain.run_cancel(run_id=running.pk, actor="t", source="api")
    for run_id in (run.pk, running.pk, *Run.objects.values_list("pk", flat=True)):
        prepared = selectors.run_get(run_id)
        plain = selectors.runs().get(pk=run_id)
        assert fields_of(prepared) == fields_of(plain)
        for related in ("ticket", "control"):
            with CaptureQueriesContext(connection) as queries:  # read with the run
                mine = getattr(prepared, related)
            assert not queries.captured_queries
            theirs = getattr(plain, related)
            assert (mine and fields_of(mine)) == (theirs and fields_of(theirs))


def test_each_call_uses_its_own_values():
    first, second = queued_run(), queued_run()
    assert selectors.run_get(first.pk).pk == first.pk
    assert selectors.run_get(str(second.pk)).pk == second.pk
    with pytest.raises(domain.RunNotFound):
        selectors.run_get(uuid.uuid4())


def test_a_claim_holds_only_for_its_generation_and_owner():
    run, generation = running_run()
    run.refresh_from_db()
    assert selectors.claim_holds(run_id=run.pk, generation=generation, owner=run.owner)
    assert not selectors.claim_holds(run_id=run.pk, generation=generation + 1, owner=run.owner)
    assert not selectors.claim_holds(run_id=run.pk, generation=generation, owner="other:1")
    assert not selectors.claim_holds(run_id=uuid.uuid4(), generation=generation,
                                     owner=run.owner)


def test_a_pending_intent_is_read_once_and_an_applied_one_is_not_pending():
    run, _ = running_run()
    domain.run_cancel(run_id=run.pk, actor="t", source="api")
    fresh = Run.objects.get(pk=run.pk)
    intent = core.pending_intent(fresh)
    assert intent == ControlIntent.objects.get(run=run)
    assert core.pending_intent(fresh) is intent  # kept on the run, not read again
    ControlIntent.objects.filter(pk=intent.pk).update(applied_at=timezone.now())
    assert core.pending_intent(Run.objects.get(pk=run.pk)) is None
    assert core.pending_intent(queued_run()) is None


@pytest.mark.parametrize("held", [(), ("viewer",), ("operator",), ("viewer", "operator")])
def test_the_key_lookup_reads_roles_as_the_queryset_does(held):
    user = make_user("alice")
    user.groups.add(*(Group.objects.get_or_create(name=role)[0] for role in held))
    Group.objects.get_or_create(name="auditors")[0].user_set.add(user)  # no role of ours
    key = keys.api_key_issue(user=user)
    values = {"digest": keys.key_digest(key)}
    plain = keys.key_lookup_queryset(**values).first()
    prepared = keys.key_lookup(**values)
    expected = ("operator" in held, "viewer" in held)
    assert (prepared._awaken_has_operator, prepared._awaken_has_viewer) == expected
    assert (plain._awaken_has_operator, plain._awaken_has_viewer) == expected
    assert fields_of(prepared) == fields_of(plain.user)
    assert keys.key_lookup(digest="0" * 64) is None


def test_every_thread_reads_on_its_own_connection():
    runs = [queued_run() for _ in range(4)]
    found, errors = {}, []

    def read(run):
        try:
            found[run.pk] = selectors.run_get(run.pk).pk
        except Exception as error:  # reported below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=read, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert found == {run.pk: run.pk for run in runs}
