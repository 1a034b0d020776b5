"""A run's budget has one rule (``runs.domain.limits.check_budget``): every way of making a
run gives the same verdict on the same budget, and the page's form and the OpenAPI document
are written from the same definition."""

import re

import pytest
from drf_spectacular.generators import SchemaGenerator

from runs import domain
from runs.domain import limits
from runs.domain.errors import InvalidRequest
from runs.models import Run
from tests.conftest import browser_for, db_state, make_user

pytestmark = pytest.mark.django_db

ALLOWED = {
    "one-step": {"max_steps": 1},
    "half-a-millisecond": {"max_seconds": 0.0005},
    "whole-seconds": {"max_seconds": 3},
    "ten-years": {"max_seconds": 315_360_000},
    "most-tokens": {"max_tokens": 2**63 - 1},
    "none-set": {"max_steps": None, "max_seconds": None},
    "empty": {},
}
REFUSED = {
    "zero-steps": {"max_steps": 0},
    "zero-seconds": {"max_seconds": 0},
    "negative-seconds": {"max_seconds": -1.5},
    "zero-tokens": {"max_tokens": 0},
    "fractional-steps": {"max_steps": 1.5},
    "steps-as-text": {"max_steps": "5"},
    "seconds-as-text": {"max_seconds": "1.5"},
    "steps-as-a-boolean": {"max_steps": True},
    "steps-over-the-column": {"max_steps": 2**31},
    "seconds-over-ten-years": {"max_seconds": 315_360_001},
    "tokens-over-the-column": {"max_tokens": 2**63},
    "unknown-key": {"max_step": 2},
    "not-an-object": "lots",
    "a-list": [1],
}


def made_by_domain(budget) -> bool:
    try:
        domain.run_create(agent="demo.steps", budget=budget, dispatch=False)
    except InvalidRequest as refused:
        assert refused.field == "budget"
        return False
    return True


def made_by_api(op_client, budget) -> bool:
    response = op_client.post("/api/runs/", {"agent": "demo.steps", "budget": budget},
                              format="json")
    assert response.status_code in (201, 400), response.content[:300]
    if response.status_code == 400:
        assert response.json()["code"] == "invalid"
    return response.status_code == 201


def made_by_batch(op_client, budget) -> bool:
    response = op_client.post("/api/runs/batch/", {"runs": [
        {"agent": "demo.steps"}, {"agent": "demo.steps", "budget": budget}]}, format="json")
    assert response.status_code in (201, 400), response.content[:300]
    if response.status_code == 400:
        assert response.json()["code"] == "invalid"
        assert "runs.1.budget" in response.json()["detail"]
    return response.status_code == 201


ENTRY_POINTS = {"domain": lambda client, budget: made_by_domain(budget),
                "api": made_by_api, "batch": made_by_batch}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("budget", [pytest.param(v, id=k) for k, v in ALLOWED.items()])
def test_every_entry_point_takes_an_allowed_budget_as_given(op_client, entry, budget):
    assert ENTRY_POINTS[entry](op_client, budget)
    run = Run.objects.order_by("-created_at", "-id").first()
    for key in limits.BUDGET_KEYS:
        assert getattr(run, key) == (budget or {}).get(key)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("budget", [pytest.param(v, id=k) for k, v in REFUSED.items()])
def test_every_entry_point_refuses_a_bad_budget_and_stores_nothing(op_client, entry, budget):
    before = db_state()
    assert not ENTRY_POINTS[entry](op_client, budget)
    assert db_state() == before


def test_run_again_and_child_runs_keep_a_budget_below_a_millisecond(op_client):
    """Run again (and a parent's child runs) make their runs through the same rule."""
    old, _ = domain.run_create(agent="demo.steps", budget={"max_seconds": 0.0005},
                                 dispatch=False)
    again, created = domain.run_rerun(run_id=old.id)
    assert created and again.max_seconds == 0.0005


def test_the_documents_budget_is_the_rule():
    document = SchemaGenerator().get_schema(request=None, public=True)
    create = document["components"]["schemas"]["RunCreateRequest"]
    assert create["properties"]["budget"] == limits.budget_schema()
    for rule in limits.BUDGETS:
        described = limits.budget_schema()["properties"][rule.key]
        assert described["maximum"] == rule.maximum
        assert described["type"] == ("integer" if rule.integral else "number")


def test_the_pages_form_has_one_field_per_budget_with_the_rules_bounds():
    page = browser_for(make_user("olga", "operator")).get("/").content.decode()
    fields = re.findall(r"<input name=\"(max_\w+)\" data-budget ([^>]*)>", page)
    assert [name for name, _ in fields] == list(limits.BUDGET_KEYS)
    for (_, attributes), rule in zip(fields, limits.BUDGETS, strict=True):
        assert f'max="{int(rule.maximum)}"' in attributes
        assert ('min="1"' in attributes) == rule.integral  # seconds: anything above 0
        assert f'step="{"1" if rule.integral else "any"}"' in attributes
