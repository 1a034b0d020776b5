"""A run's budget has one rule (``runs.domain.limits.check_budget``): every way of making a
run gives the same verdict on the same budget, and the page's form and the OpenAPI document
are written from the same definition."""

import re

import pytest
from drf_spectacular.generators import SchemaGenerator

from runs import domain
from runs.agents import Agent, register
from runs.domain import limits, prices
from runs.domain.errors import InvalidRequest
from runs.models import Activity, BulkJob, Run
from tests.conftest import browser_for, client_for, db_state, make_user
from tests.factories import running_run

pytestmark = pytest.mark.django_db

ALLOWED = {
    "one-step": {"max_steps": 1},
    "half-a-millisecond": {"max_seconds": 0.0005},
    "whole-seconds": {"max_seconds": 3},
    "ten-years": {"max_seconds": 315_360_000},
    "most-tokens": {"max_tokens": 2**63 - 1},
    "a-cent": {"max_cost_usd": 0.01},
    "whole-dollars": {"max_cost_usd": 2},
    "two-repeats": {"max_repeats": 2},
    "pause-when-reached": {"max_steps": 3, "on_exhausted": "pause"},
    "stop-when-reached": {"on_exhausted": "stop"},
    "none-set": {"max_steps": None, "max_seconds": None},
    "empty": {},
}
REFUSED = {
    "zero-steps": {"max_steps": 0},
    "zero-seconds": {"max_seconds": 0},
    "negative-seconds": {"max_seconds": -1.5},
    "zero-tokens": {"max_tokens": 0},
    "zero-dollars": {"max_cost_usd": 0},
    "dollars-as-text": {"max_cost_usd": "1"},
    "zero-repeats": {"max_repeats": 0},
    "fractional-repeats": {"max_repeats": 1.5},
    "unknown-policy": {"on_exhausted": "later"},
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
    assert run.on_exhausted == (budget or {}).get("on_exhausted", "stop")


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


# --- prices -----------------------------------------------------------------------------


def test_a_call_is_priced_from_the_table_or_the_setting_and_an_unknown_model_has_none(
        settings):
    # gpt-4o in genai-prices' table: $2.50 in, $10 out per million tokens.
    assert prices.call_cost("gpt-4o", 1_000_000, 1_000_000) == pytest.approx(12.5)
    assert prices.call_cost("echo", 10, 10) is None
    settings.AWAKEN_MODEL_PRICES = '{"echo": {"input": 1, "output": 3}, "gpt-4o": ' \
                                   '{"input": 0, "output": 0}}'
    assert prices.call_cost("echo", 2_000_000, 1_000_000) == pytest.approx(5.0)
    assert prices.call_cost("gpt-4o", 1_000_000, 1_000_000) == 0  # one's own rate wins


@pytest.mark.parametrize("text", ["[1]", "{", '{"m": {"input": 1}}', '{"m": {"input": -1, '
                                  '"output": 1}}', '{"m": {"input": "1", "output": 1}}'])
def test_a_bad_price_table_is_refused_at_start(text):
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="AWAKEN_MODEL_PRICES"):
        prices.parse_prices(text)


def reply(model, prompt=10, completion=20):
    return {"model": model, "content": "", "usage": {"prompt": prompt, "completion": completion}}


def test_a_step_with_an_unpriced_model_makes_the_cost_unknown_with_one_warning(settings):
    settings.AWAKEN_MODEL_PRICES = '{"mine": {"input": 1000, "output": 1000}}'
    run, generation = running_run()
    domain.attempt_step(run_id=run.id, generation=generation, data={"replies": [reply("mine")]})
    assert Run.objects.get(pk=run.id).cost_usd == pytest.approx(0.03)
    for _ in range(2):
        domain.attempt_step(run_id=run.id, generation=generation,
                            data={"replies": [reply("mine"), reply("private-llm")]})
    run = Run.objects.get(pk=run.id)
    assert run.cost_usd is None and run.steps == 3  # unknown from then on, never 0
    step = run.events.filter(kind="step").order_by("-seq").first()
    assert step.data["cost_usd"] is None and step.data["unpriced_models"] == ["private-llm"]
    (warning,) = Activity.objects.filter(run=run, kind="warning")
    assert "private-llm" in warning.text and "AWAKEN_MODEL_PRICES" in warning.text
    page = browser_for(make_user("olga", "operator")).get(f"/runs/{run.id}/").content.decode()
    assert "cost unknown" in page


# --- pauses at a budget, and their resume ---------------------------------------------------


def paused_at(code, reason="Reached.", **budget):
    run, generation = running_run(budget={"on_exhausted": "pause", **budget})
    ticket = domain.attempt_budget_reached(run_id=run.id, generation=generation, code=code,
                                           reason=reason)
    return Run.objects.get(pk=run.id), ticket


def test_a_budget_ticket_says_the_limit_and_the_page_offers_to_raise_it():
    run, ticket = paused_at("max_steps", "Step budget of 3 reached.", max_steps=3)
    assert (run.state, ticket.reason) == ("awaiting", "budget")
    assert ticket.prompt["limit"] == "max_steps" and ticket.prompt["budget"]["max_steps"] == 3
    assert ticket.prompt["usage"]["steps"] == 0
    page = browser_for(make_user("olga", "operator")).get(f"/runs/{run.id}/").content.decode()
    assert "Paused: budget reached" in page and "Step budget of 3 reached." in page
    assert re.search(r'<input name="max_steps" data-raise="max_steps" [^>]*value="6"', page)
    assert 'data-run-action="raise-budget"' in page


def test_a_resume_of_a_budget_ticket_must_raise_the_limit_reached():
    run, ticket = paused_at("max_cost", "Cost budget reached.", max_cost_usd=0.5, max_steps=9)
    client = client_for(make_user("olga", "operator"))
    before = db_state()
    for refused in ({"budget": {"max_steps": 20}}, {"budget": {"max_cost_usd": 0.5}},
                    {"budget": {"max_cost_usd": "1"}}, {"raise": 1}):
        response = client.post(f"/api/runs/{run.id}/resume/",
                               {"ticket": str(ticket.pk), "input": refused}, format="json")
        assert (response.status_code, response.json()["code"]) == (400, "invalid"), refused
    assert db_state() == before
    response = client.post(f"/api/runs/{run.id}/resume/", {"ticket": str(ticket.pk), "input": {
        "budget": {"max_cost_usd": 2, "max_steps": 20}}}, format="json")
    assert response.status_code == 200
    budget = response.json()["budget"]
    assert (budget["max_cost_usd"], budget["max_steps"]) == (2, 20)
    assert response.json()["state"] == "queued"


def test_a_budget_reached_without_pause_stops_the_run_with_its_code():
    run, generation = running_run(budget={"max_cost_usd": 1})
    assert domain.attempt_budget_reached(run_id=run.id, generation=generation,
                                         code="max_cost", reason="Cost budget of $1 reached.")
    run = Run.objects.get(pk=run.id)
    assert (run.end_cause, run.stop_code) == ("stopped", "max_cost")


def test_the_list_filters_by_ticket_reason_and_a_bulk_resume_leaves_input_tickets_alone(
        op_client, monkeypatch):
    from runs.domain import outside

    monkeypatch.setattr(outside.workers, "bulk_queued", lambda **kw: None)
    monkeypatch.setattr(outside.workers, "runs_queued", lambda **kw: None)
    looped, _ = paused_at("max_repeats", "Looping.", max_repeats=2)
    budgeted, _ = paused_at("max_steps", max_steps=1)
    listed = op_client.get("/api/runs/?ticket_reason=loop").json()["results"]
    assert [run["id"] for run in listed] == [str(looped.id)]
    page = browser_for(make_user("pia", "operator")).get("/?ticket_reason=budget")
    assert str(budgeted.id) in page.content.decode()
    assert str(looped.id) not in page.content.decode()

    response = op_client.post("/api/bulk/", {"action": "resume", "ids": [
        str(looped.id), str(budgeted.id)]}, format="json")
    assert response.status_code == 201, response.content
    domain.bulk_job_run(job_id=response.json()["id"])
    job = BulkJob.objects.get(pk=response.json()["id"])
    assert (job.state, job.applied, job.refused) == ("done", 1, 1)
    assert Run.objects.get(pk=looped.id).state == "queued"
    assert Run.objects.get(pk=looped.id).repeats == {}  # the loop's counts start again
    assert Run.objects.get(pk=budgeted.id).state == "awaiting"  # needs a raised budget


def looked_up(order: str) -> str:
    return f"order {order}"


@register
class Repeating(Agent):
    """Calls one tool with the same arguments, a step each time, with ``ctx.tool``."""

    name = "test.budgets.repeating"

    async def run(self, ctx):
        while True:
            async with ctx.step():
                await ctx.tool(looked_up, order="E-1")


@pytest.mark.postgres  # an executor's threads and this one: SQLite's shared cache locks tables
@pytest.mark.django_db(transaction=True)
def test_the_loop_guard_counts_direct_tool_calls_too():
    """Not only the calls the model asks for: every tool call through the host counts, by
    tool and argument digest, and the one past max_repeats never runs."""
    from harness.processes import wait_until
    from runs.domain.actions import action_digest
    from runs.models import Event
    from runs.runtime.executor import Executor

    run, _ = domain.run_create(agent=Repeating.name, input={}, dispatch=False,
                               budget={"max_repeats": 2})
    executor = Executor(node="loops", lease_seconds=3600, db_threads=1)
    try:
        assert executor.start([run.id]) == 1
        run = wait_until(lambda: (lambda r: r if r.state == "awaiting" else None)(
            Run.objects.select_related("ticket").get(pk=run.id)), 20, "the loop ticket")
    finally:
        executor.close()
    digest = action_digest("looked_up", {"order": "E-1"})
    assert (run.ticket.reason, run.ticket.prompt["digest"], run.steps) == ("loop", digest, 2)
    assert run.repeats == {digest: 2}
    steps = Event.objects.filter(run_id=run.id, kind="step").order_by("seq")
    assert [[tool["digest"] for tool in step.data["tools"]] for step in steps] == [
        [digest], [digest]]


SEEN_USAGE = {}  # run id -> the usage the agent saw after each step


@register
class Spending(Agent):
    """Steps that each call a priced model and a tool until its cost budget stops it,
    noting ``ctx.usage`` after each step (the step may not be written yet then)."""

    name = "test.budgets.spending"

    async def run(self, ctx):
        seen = SEEN_USAGE.setdefault(ctx.run_id, [])
        while True:
            async with ctx.step():
                ctx.model_call(model="mine", ms=1.0, prompt_tokens=1000, completion_tokens=700)
                await ctx.tool(looked_up, order=f"E-{len(seen) % 2}")
            seen.append(dict(ctx.usage))


@pytest.mark.postgres  # an executor's threads and this one: SQLite's shared cache locks tables
@pytest.mark.django_db(transaction=True)
def test_the_usage_an_agent_sees_after_a_step_is_the_committed_one(settings):
    """Whether its step is written yet or not, the usage the agent and the budget checks
    see after a step is what the step commits, and the cost budget stops the run where
    the committed figures say."""
    from harness.processes import wait_until
    from runs.models import Event
    from runs.runtime.executor import Executor

    settings.AWAKEN_MODEL_PRICES = '{"mine": {"input": 1.5, "output": 2.5}}'
    run, _ = domain.run_create(agent=Spending.name, input={}, dispatch=False,
                               budget={"max_cost_usd": 0.01, "max_repeats": 100})
    executor = Executor(node="spending", lease_seconds=3600, db_threads=1)
    try:
        assert executor.start([run.id]) == 1
        run = wait_until(lambda: (lambda r: r if r.state == "ended" else None)(
            Run.objects.get(pk=run.id)), 20, "the cost budget to stop the run")
    finally:
        executor.close()
    committed, steps, tokens, cost = [], 0, 0, 0.0
    for step in Event.objects.filter(run_id=run.id, kind="step").order_by("seq"):
        steps, tokens, cost = steps + 1, tokens + step.data["tokens"], cost + step.data["cost_usd"]
        committed.append({"steps": steps, "tokens": tokens, "cost_usd": cost})
    assert SEEN_USAGE[str(run.id)] == committed
    assert (run.steps, run.tokens, run.cost_usd) == (steps, tokens, cost)
    assert run.stop_code == "max_cost" and cost >= 0.01 > cost - committed[0]["cost_usd"]
    assert len(run.repeats) == 2 and sum(run.repeats.values()) == steps
