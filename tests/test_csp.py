"""The Content-Security-Policy of the browser pages: sent everywhere, the API's answers and
refusals included, and the templates give it nothing to refuse (tests/test_browser.py loads
every page in a real browser)."""

import re
from pathlib import Path

import pytest

from awaken_site.csp import policy_header
from tests.conftest import browser_for, client_for, make_user
from tests.factories import queued_run

pytestmark = pytest.mark.django_db

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def directives(response) -> dict[str, list[str]]:
    policy = response["Content-Security-Policy"]
    return {name: values for name, *values in (part.split() for part in policy.split(";"))}


@pytest.fixture
def staff(db):
    return browser_for(make_user("ada", "operator", is_staff=True, is_superuser=True))


@pytest.mark.parametrize("path", [
    "/accounts/login/", "/", "/runs/{run}/", "/runs/{run}/panel/", "/admin/",
    "/admin/runs/run/{run}/change/", "/api/docs/",
])
def test_every_page_sends_a_policy_without_inline_script(staff, path):
    response = staff.get(path.format(run=queued_run().id))
    assert response.status_code == 200
    policy = directives(response)
    assert policy["script-src"] == ["'self'"] and policy["style-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    assert "'unsafe-inline'" not in response["Content-Security-Policy"]


def test_the_apis_answers_and_refusals_carry_the_same_policy(staff):
    page = staff.get("/")["Content-Security-Policy"]
    run = queued_run()
    operator = client_for(make_user("grace", "operator"))
    answers = [operator.get(f"/api/runs/{run.id}/"), operator.post("/api/runs/", {},
                                                                   format="json"),
               client_for(None).get("/api/runs/"), operator.get("/api/runs/nope/")]
    assert [a.status_code for a in answers] == [200, 400, 401, 404]
    assert [a["Content-Security-Policy"] for a in answers] == [page] * 4


def test_the_header_names_each_directive_once_in_the_order_given():
    assert policy_header({"default-src": ["'self'"], "img-src": ["'self'", "data:"],
                          "object-src": ["'none'"]}) == (
        "default-src 'self'; img-src 'self' data:; object-src 'none'")


def test_the_api_docs_load_their_start_up_script_from_a_url(staff):
    page = staff.get("/api/docs/").content.decode()
    assert re.findall(r"<script>", page) == [] and "<style>" not in page
    (script,) = re.findall(r'<script src="(/api/docs/\?[^"]*script[^"]*)"', page)
    response = staff.get(script.replace("&amp;", "&"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/javascript")
    assert b"SwaggerUIBundle(" in response.content


INLINE = [
    (re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I), "an inline <script>"),
    (re.compile(r"\son[a-z]+\s*=", re.I), "an inline event handler"),
    (re.compile(r"\sstyle\s*=", re.I), "a style attribute"),
    (re.compile(r"<style", re.I), "a <style> element"),
    (re.compile(r"javascript:", re.I), "a javascript: URL"),
]


@pytest.mark.parametrize("template", sorted(TEMPLATES.rglob("*.html")),
                         ids=lambda path: str(path.relative_to(TEMPLATES)))
def test_no_template_has_inline_script_or_style(template):
    text = template.read_text()
    for pattern, what in INLINE:
        assert not pattern.search(text), f"{template.name} has {what}"
