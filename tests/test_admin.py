"""The admin: read-only rows, and actions that go through the services as source ``admin``."""

import pytest

from runs.models import Event, ResumeTicket, Run, TicketState
from tests.conftest import browser_for, make_user
from tests.factories import awaiting_run, queued_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_operator(db):
    return browser_for(make_user("ada", "operator", is_staff=True))


@pytest.fixture
def staff_viewer(db):
    return browser_for(make_user("vic", "viewer", is_staff=True))


def act(client, model, action, ids, **extra):
    return client.post(f"/admin/runs/{model}/", {"action": action, "_selected_action":
                                                 [str(i) for i in ids], **extra}, follow=True)


def test_cancel_action_records_source_admin(staff_operator):
    run = queued_run()
    response = act(staff_operator, "run", "cancel_runs", [run.id])
    assert response.status_code == 200
    run.refresh_from_db()
    assert run.end_cause == "cancelled"
    assert run.control.source == "admin" and run.control.requested_by == "ada"
    assert Event.objects.get(run=run, kind="ended").source == "admin"


def test_stop_action_asks_for_a_reason_first(staff_operator):
    run = queued_run()
    form = act(staff_operator, "run", "stop_runs", [run.id])
    assert b'name="reason"' in form.content
    run.refresh_from_db()
    assert run.state == "queued"  # nothing happens until a reason is given
    act(staff_operator, "run", "stop_runs", [run.id], apply="1", reason="maintenance window")
    run.refresh_from_db()
    assert (run.end_cause, run.stop_reason, run.control.source) == (
        "stopped", "maintenance window", "admin")


def test_resume_action_uses_the_open_ticket(staff_operator):
    run, ticket_id = awaiting_run()
    act(staff_operator, "run", "resume_runs", [run.id])
    run.refresh_from_db()
    assert run.state == "queued"
    assert ResumeTicket.objects.get(pk=ticket_id).state == TicketState.CONSUMED


def test_revoking_a_ticket_stops_its_run(staff_operator):
    run, ticket_id = awaiting_run()
    act(staff_operator, "resumeticket", "revoke_tickets", [ticket_id])
    run.refresh_from_db()
    assert (run.end_cause, run.stop_code) == ("stopped", "operator")
    assert ResumeTicket.objects.get(pk=ticket_id).state == TicketState.REVOKED


def test_an_action_on_an_ended_run_changes_nothing(staff_operator):
    run = queued_run()
    act(staff_operator, "run", "cancel_runs", [run.id])
    versions = Run.objects.get(pk=run.id).version
    response = act(staff_operator, "run", "stop_runs", [run.id], apply="1", reason="again")
    assert b"already ended" in response.content
    assert Run.objects.get(pk=run.id).version == versions


def test_viewers_see_runs_but_get_no_control_actions(staff_viewer):
    run = queued_run()
    page = staff_viewer.get("/admin/runs/run/")
    assert page.status_code == 200 and str(run.id).encode() in page.content
    assert b"cancel_runs" not in page.content
    act(staff_viewer, "run", "cancel_runs", [run.id])
    assert Run.objects.get(pk=run.id).state == "queued"


def test_rows_cannot_be_edited_or_added(staff_operator):
    run = queued_run()
    assert staff_operator.get("/admin/runs/run/add/").status_code == 403
    page = staff_operator.get(f"/admin/runs/run/{run.id}/change/")
    assert page.status_code == 200 and b'name="state"' not in page.content


@pytest.mark.parametrize("query", ["demo.steps", "not-a-uuid", "00000000-0000-0000-0000-00000000"])
def test_search_never_fails(staff_operator, query):
    queued_run()
    assert staff_operator.get("/admin/runs/run/", {"q": query}).status_code == 200


def test_search_by_id(staff_operator):
    run, other = queued_run(), queued_run()
    page = staff_operator.get("/admin/runs/run/", {"q": str(run.id)})
    assert str(run.id).encode() in page.content and str(other.id).encode() not in page.content
