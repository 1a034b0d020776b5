"""What JSON from outside must be before it is stored (runs/domain/limits.py), checked by
the domain themselves, whichever interface calls them."""

import pytest

from runs import domain
from runs.domain import limits
from runs.domain.errors import InvalidRequest
from tests.conftest import db_state
from tests.factories import awaiting_run, queued_run

pytestmark = pytest.mark.django_db


def deep(levels: int):
    value = []
    for _ in range(levels - 1):
        value = [value]
    return value


BAD_VALUES = {
    "nested-65-deep": deep(65),
    "nested-100000-deep": deep(100_000),
    "infinity": {"a": float("inf")},
    "minus-infinity": [float("-inf")],
    "nan": {"a": [float("nan")]},
    "lone-surrogate": {"a": "\ud800"},
    "lone-surrogate-key": {"\udc00": 1},
    "nul": {"a": ["x\x00"]},
    "nul-key": {"a\x00": 1},
}


@pytest.mark.parametrize("value", [pytest.param(v, id=k) for k, v in BAD_VALUES.items()])
def test_it_refuses_what_no_database_stores_alike(value):
    with pytest.raises(InvalidRequest) as refused:
        limits.check_json(value, "input")
    assert refused.value.field.startswith("input")


@pytest.mark.parametrize("value", [deep(64), {"é": "😀"}, {"n": 1e308, "m": -0.0}, 10**40, None])
def test_it_accepts_ordinary_json(value):
    limits.check_json(value, "input")


@pytest.mark.parametrize("value", [pytest.param(v, id=k) for k, v in BAD_VALUES.items()
                                   if isinstance(v, dict)])
def test_every_service_that_takes_json_refuses_it_and_changes_nothing(value):
    queued = queued_run()
    awaiting, ticket = awaiting_run()
    before = db_state()
    calls = [
        lambda: domain.run_create(agent="demo.steps", input=value, dispatch=False),
        lambda: domain.runs_create(runs=[{"agent": "demo.steps", "input": value}]),
        lambda: domain.run_resume(run_id=awaiting.id, ticket_id=ticket, input=value,
                                    actor="olga", source="cli"),
        lambda: domain.run_live_command(run_id=queued.id, command="message", message=value,
                                     actor="olga", source="cli"),
    ]
    for call in calls:
        with pytest.raises(InvalidRequest):
            call()
    assert db_state() == before


def test_an_input_over_the_setting_is_refused(settings):
    settings.AWAKEN_MAX_INPUT_BYTES = 100
    fits = {"a": "é" * 46}  # 8 bytes of structure and 92 of text: 100
    domain.run_create(agent="demo.steps", input=fits, dispatch=False)
    with pytest.raises(InvalidRequest, match="larger than 100 bytes"):
        domain.run_create(agent="demo.steps", input={"a": "é" * 47}, dispatch=False)
    awaiting, ticket = awaiting_run()
    with pytest.raises(InvalidRequest):
        domain.run_resume(run_id=awaiting.id, ticket_id=ticket, input=["x" * 100],
                            actor="olga", source="cli")
