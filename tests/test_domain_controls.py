"""The domain functions behind pause, live delivery and ticket revocation: views, the admin and
commands call these, never the transport or the rows."""

import uuid

import pytest

from runs import domain
from runs.domain.errors import InvalidRequest, NotActive, NotAwaiting
from runs.models import ControlIntent, Event, ResumeTicket, Run
from tests.conftest import db_state
from tests.factories import awaiting_run, queued_run, running_run

pytestmark = pytest.mark.django_db


def test_revoking_an_open_ticket_stops_its_run_and_records_who_asked():
    run, ticket_id = awaiting_run()
    result = domain.ticket_revoke(ticket_id=ticket_id, actor="olga", source="admin")
    assert result.path == "durable"
    run = Run.objects.get(pk=run.id)
    assert (run.state, run.end_cause, run.stop_code) == ("ended", "stopped", "operator")
    assert ticket_id[:8] in run.stop_reason
    ticket = ResumeTicket.objects.get(pk=ticket_id)
    assert (ticket.state, ticket.closed_by) == ("revoked", "olga")
    intent = ControlIntent.objects.get(run=run)
    assert (intent.action, intent.requested_by, intent.source) == ("stop", "olga", "admin")
    assert intent.applied_via == "durable"
    assert [e.kind for e in Event.objects.filter(run=run).order_by("seq")][-2:] == [
        "stop_requested", "ended"]


def test_revoking_with_a_reason_keeps_it():
    run, ticket_id = awaiting_run()
    domain.ticket_revoke(ticket_id=ticket_id, actor="olga", source="cli", reason="stale")
    assert Run.objects.get(pk=run.id).stop_reason == "stale"


@pytest.mark.parametrize("ticket", ["consumed", "revoked", "unknown", "not-a-uuid"])
def test_revoking_a_ticket_that_is_not_open_changes_nothing(ticket):
    run, ticket_id = awaiting_run()
    if ticket == "consumed":
        domain.run_resume(run_id=run.id, ticket_id=ticket_id, actor="olga", source="api")
    elif ticket == "revoked":
        domain.ticket_revoke(ticket_id=ticket_id, actor="olga", source="api")
    else:
        ticket_id = str(uuid.uuid4()) if ticket == "unknown" else "nope"
    before = db_state()
    error = NotAwaiting if ticket in ("consumed", "revoked") else InvalidRequest
    with pytest.raises(error):
        domain.ticket_revoke(ticket_id=ticket_id, actor="olga", source="api")
    assert db_state() == before


def test_pause_and_delivery_to_a_run_without_a_live_attempt_are_not_active():
    run = queued_run()
    before = db_state()
    with pytest.raises(NotActive):
        domain.run_pause(run_id=run.id, actor="olga", source="api")
    with pytest.raises(NotActive):
        domain.run_live_command(run_id=run.id, command="wake", actor="olga", source="api")
    assert db_state() == before


def test_an_unknown_live_command_is_refused():
    run = queued_run()
    with pytest.raises(InvalidRequest):
        domain.run_live_command(run_id=run.id, command="explode", actor="olga", source="api")


@pytest.mark.parametrize("child", [False, True], ids=["run", "child of an ended parent"])
def test_a_running_attempt_is_told_before_the_request_is_published(
        child, monkeypatch, django_capture_on_commit_callbacks):
    """After commit the live command is handed on first: it is what ends the attempt, and
    the publication of the change would hold it up."""
    from runs.domain import outside
    from runs.domain.core import Ending

    parent, generation = running_run()
    run = running_run(parent_id=parent.id)[0] if child else parent
    happened = []

    class Workers:
        def send_command(self, *, run_id, command, **details):
            happened.append(("told", str(run_id), command))

    class Changes:
        def publish_changes(self, *, changes):
            happened.extend(("published", str(changed.pk), event.kind)
                            for changed, event in changes)

    monkeypatch.setattr(outside, "workers", Workers())
    monkeypatch.setattr(outside, "changes", Changes())
    with django_capture_on_commit_callbacks(execute=True):
        if child:
            domain.attempt_finish(run_id=parent.id, generation=generation,
                                  ending=Ending.failed("boom"))
        else:
            domain.run_cancel(run_id=run.id, actor="olga", source="api")
    told = happened.index(("told", str(run.pk), "cancel"))
    assert happened[told + 1] == ("published", str(run.pk), "cancel_requested")
    assert Run.objects.get(pk=run.id).control.action == "cancel"
