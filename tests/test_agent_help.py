"""What the new-run form says of each agent: its description and an example input, both
from the agent's own declaration, rendered by the server for every agent."""

import html
import json
import re

import pytest

from runs.agents import Agent, register
from runs.agents.wrapping import FrameworkAgent, wrapped
from runs.domain import catalogue
from tests.conftest import browser_for, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def scratch_catalogue(monkeypatch):
    """The catalogue as it is, given back as it was after the test."""
    monkeypatch.setattr(catalogue, "CATALOGUE", dict(catalogue.CATALOGUE))
    return catalogue.CATALOGUE


def helps(page: str) -> dict:
    """Per agent of the page's form: its description and example (JSON text or None),
    and whether it is shown."""
    found = {}
    for match in re.finditer(r'<div data-agent-help="([^"]+)"( hidden)?>(.*?)</div>', page,
                             re.S):
        name, hidden, body = match.groups()
        text = re.search(r"<p>(.*?)</p>", body, re.S).group(1)
        example = re.search(r"<code data-example>(.*?)</code>", body, re.S)
        found[html.unescape(name)] = {
            "description": html.unescape(text), "shown": not hidden,
            "example": html.unescape(example.group(1)) if example else None}
    return found


def test_the_form_ships_every_agents_description_and_example_and_shows_the_first():
    page = browser_for(make_user("olga", "operator")).get("/").content.decode()
    found = helps(page)
    assert set(found) == set(catalogue.names())
    assert [name for name, help in found.items() if help["shown"]] == ["demo.steps"]
    steps = found["demo.steps"]
    assert steps["description"] == ("Steps through simulated inference calls, then completes "
                                    "with its output.")
    assert json.loads(steps["example"]) == catalogue.CATALOGUE["demo.steps"].example
    # The input starts as the chosen agent's example, not a fixed one.
    textarea = re.search(r'<textarea name="input"[^>]*>(.*?)</textarea>', page, re.S).group(1)
    assert json.loads(html.unescape(textarea)) == json.loads(steps["example"])
    # Its docstring's first paragraph only, without the markup of code.
    assert found["demo.email"]["description"] == (
        "Asks a person to approve one send_email(to, body) call, then sends it (or not).")
    assert json.loads(found["demo.email"]["example"])["to"] == "team@example.com"


SHIPPED = ("demo.", "pydantic_ai.", "openai_agents.", "langgraph.", "example.")


def test_every_shipped_agent_gives_an_example_and_a_description():
    shipped = [agent for agent in catalogue.described() if agent["name"].startswith(SHIPPED)]
    assert len(shipped) >= 13
    for agent in shipped:
        assert agent["description"], agent["name"]
        assert isinstance(agent["example"], dict), agent["name"]


def test_a_framework_agent_says_what_it_was_wrapped_with_not_its_adapters_docstring(
        scratch_catalogue):
    class Adapter(FrameworkAgent):
        """The adapter's own text, which is about no agent."""

    plain = wrapped(Adapter, object(), name="test.plain", ready=lambda made: True,
                    prefix="Test")
    told = wrapped(Adapter, object(), name="test.told", ready=lambda made: True,
                   prefix="Test", description="Answers.", example={"prompt": "hi"})
    assert catalogue.description(plain) == "" and plain.example is None
    assert (catalogue.description(told), told.example) == ("Answers.", {"prompt": "hi"})


def test_an_agent_without_a_description_or_example_says_so(scratch_catalogue):
    @register
    class Quiet(Agent):
        name = "test.quiet"

    page = browser_for(make_user("olga", "operator")).get("/").content.decode()
    quiet = helps(page)["test.quiet"]
    assert quiet == {"description": "This agent says nothing about itself.", "shown": False,
                     "example": None}
    assert "No example input." in page


@pytest.mark.parametrize("example", [["steps", 5], "steps=5", {"when": object()}])
def test_an_example_that_is_not_a_json_object_is_refused_when_registered(
        scratch_catalogue, example):
    class Odd(Agent):
        name = "test.odd"

    Odd.example = example
    with pytest.raises(ValueError, match="example"):
        register(Odd)
    assert "test.odd" not in catalogue.CATALOGUE


def test_viewers_get_no_form_and_no_help():
    page = browser_for(make_user("vic", "viewer")).get("/").content.decode()
    assert "data-agent-help" not in page
