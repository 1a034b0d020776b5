"""The admin: read-only rows, and actions that go through the domain as source ``admin``."""

import pytest

from runs import domain
from runs.models import Attempt, ControlIntent, Event, ResumeTicket, Run, TicketState
from tests.conftest import browser_for, make_user
from tests.factories import awaiting_run, queued_run, running_run

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


# --- the audit trail is kept: nothing is deleted in the admin -------------------------------


@pytest.fixture
def superuser(db):
    return browser_for(make_user("root", is_staff=True, is_superuser=True))


@pytest.fixture
def audit_trail(db) -> dict:
    """A row of every run-control model: a running run asked to stop (attempt, intent,
    events) and an awaiting run (ticket)."""
    running, _ = running_run()
    domain.run_stop(run_id=running.id, actor="ada", source="admin", reason="r")
    awaiting, ticket_id = awaiting_run()
    return {"run": running.pk, "attempt": Attempt.objects.get(run=running).pk,
            "controlintent": ControlIntent.objects.get(run=running).pk,
            "resumeticket": ticket_id, "event": Event.objects.filter(run=running).first().pk}


def trail() -> dict:
    return {model.__name__: model.objects.count()
            for model in (Run, Attempt, ResumeTicket, ControlIntent, Event)}


@pytest.mark.parametrize("model", ["run", "attempt", "resumeticket", "controlintent", "event"])
def test_no_one_can_delete_a_row_of_the_audit_trail(superuser, audit_trail, model):
    before = trail()
    pk = audit_trail[model]
    page = superuser.get(f"/admin/runs/{model}/")
    assert page.status_code == 200 and b"delete_selected" not in page.content
    assert superuser.get(f"/admin/runs/{model}/{pk}/delete/").status_code == 403
    assert superuser.post(f"/admin/runs/{model}/{pk}/delete/", {"post": "yes"}).status_code == 403
    # The bulk action, asked for by name as a crafted form would.
    act(superuser, model, "delete_selected", [pk], post="yes")
    assert trail() == before


@pytest.mark.parametrize("url", [
    "/admin/runs/run/?q=%00", "/admin/runs/run/?agent=%00", "/admin/runs/run/?state__exact=a%00",
    "/admin/runs/event/?actor=%00", "/admin/runs/attempt/?owner=%00", "/admin/runs/run/?%00=1",
])
def test_a_nul_in_a_filter_or_search_is_a_bad_lookup(staff_operator, url):
    # It should answer as Django's admin answers any bad lookup: back to the list, flagged.
    queued_run()
    response = staff_operator.get(url)
    assert response.status_code == 302
    assert response["Location"].endswith("?e=1")
