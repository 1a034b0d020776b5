"""API fuzzing with schemathesis against our own OpenAPI document, as an operator and as a
viewer: never a 500, never an answer the document does not describe. Then hostile input
spliced into the bodies and query strings schemathesis makes: each is refused with a 4xx
JSON error and changes nothing. The number of inputs tried is reported at the end."""

import json
from collections import Counter
from urllib.parse import urlencode

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient
from rest_framework.utils.encoders import JSONEncoder
from schemathesis.specs.openapi.checks import positive_data_acceptance

from runs.domain.keys import api_key_issue
from runs.domain.review import review_link_create
from tests.conftest import db_state, make_user
from tests.factories import awaiting_run, queued_run

pytestmark = pytest.mark.django_db

DOCUMENT = json.loads(json.dumps(SchemaGenerator().get_schema(request=None, public=True),
                                 cls=JSONEncoder))
SCHEMA = schemathesis.openapi.from_dict(DOCUMENT)
SCHEMA.app = get_wsgi_application()
OPERATIONS = {op.ok().label: op.ok() for op in SCHEMA.get_all_operations()}

TRIED: Counter = Counter()  # inputs sent, by test


@pytest.fixture(scope="module", autouse=True)
def report_the_count(request):
    yield
    if TRIED:
        plugins = request.config.pluginmanager
        by_kind = ", ".join(f"{kind} {count}" for kind, count in sorted(TRIED.items()))
        with plugins.get_plugin("capturemanager").global_and_fixture_disabled():
            plugins.get_plugin("terminalreporter").write_line(
                f"\nAPI fuzzing: {sum(TRIED.values())} inputs tried ({by_kind})")


@pytest.fixture(autouse=True)
def keep_the_test_connection():
    # As Django's test client does: the app must not close the connection that holds the
    # test's transaction at the end of each request.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture(params=["operator", "viewer"])
def token(request, settings):
    # Schemathesis calls the app as host "localhost".
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "localhost"]
    queued_run()
    awaiting_run()
    user = make_user(f"fuzz-{request.param}", request.param)
    return api_key_issue(user=user)


@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_the_api_keeps_its_contract(label, token):
    operation = OPERATIONS[label]

    @given(case=operation.as_strategy())
    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def call(case):
        TRIED["schemathesis"] += 1
        # Everything but "valid data must be accepted": an opaque cursor that is well-formed
        # but was never handed out is refused (400), as documented.
        case.call_and_validate(headers={"Authorization": f"Token {token}"},
                               excluded_checks=[positive_data_acceptance])

    call()


# --- hostile input ------------------------------------------------------------------------

# JSON text that no body may hold, wherever it is put: each is refused by the parser.
HOSTILE_VALUES = {
    "nested-5000-deep": "[" * 5000 + "]" * 5000,
    "nested-65-deep": "[" * 65 + "]" * 65,
    "objects-nested-100-deep": '{"a": ' * 100 + "1" + "}" * 100,
    "1e400": "1e400",
    "-1e999": "-1e999",
    "NaN": "NaN",
    "Infinity": "Infinity",
    "lone-high-surrogate": r'"\ud800"',
    "lone-low-surrogate": r'"tail \udfff"',
    "surrogates-reversed": r'"\udc00\ud800"',
    "surrogate-key": r'{"\udbff": 1}',
    "nul": r'"\u0000"',
    "nul-inside": r'"abc\u0000def"',
    "nul-key": r'{"a\u0000": true}',
}
# Changes to the body's structure: unknown or repeated keys where the API declares its
# fields, and bodies or inputs over the limits.
HOSTILE_SHAPES = ["unknown-key", "key-twice", "body-over-1-mib", "input-over-256-kib"]
SENTINEL = "hostile-value-goes-here"
RUN_IDS = {}  # run_id of each operation's path: a run in the state that reaches its parser


def places(body, path=()):
    """Every place in ``body`` a value can be put: each existing value, and a new key of
    each object."""
    if isinstance(body, dict):
        yield (*path, SENTINEL)
        for key, value in body.items():
            yield (*path, key)
            yield from places(value, (*path, key))
    elif isinstance(body, list):
        for index, value in enumerate(body):
            yield (*path, index)
            yield from places(value, (*path, index))


def put(body, place, value):
    target = body
    for step in place[:-1]:
        target = target[step]
    target[place[-1]] = value


def declared_objects(body) -> list:
    """The objects of ``body`` whose keys the API declares: the body, a budget, a batch item
    (an input or a message is free-form)."""
    found = [body]
    for item in [body, *(body.get("runs") or [])]:
        if isinstance(item, dict):
            if item is not body:
                found.append(item)
            if isinstance(item.get("budget"), dict):
                found.append(item["budget"])
    return found


def hostile_body(body: dict, kind: str, draw) -> str:
    """The text of ``body`` made hostile by ``kind``."""
    if kind in HOSTILE_VALUES:
        put(body, draw(st.sampled_from(list(places(body)))), SENTINEL)
        return json.dumps(body).replace(json.dumps(SENTINEL), HOSTILE_VALUES[kind], 1)
    if kind == "unknown-key":
        draw(st.sampled_from(declared_objects(body)))["not_a_field"] = 1
    elif kind == "key-twice":
        target = draw(st.sampled_from(declared_objects(body)))
        key = draw(st.sampled_from(sorted(target))) if target else "reason"
        target.setdefault(key, None)
        target[SENTINEL] = None
        return json.dumps(body).replace(json.dumps(SENTINEL), json.dumps(key), 1)
    elif kind == "body-over-1-mib":
        put(body, draw(st.sampled_from(list(places(body)))), "x" * (1024 * 1024))
    elif kind == "input-over-256-kib":
        holders = body.get("runs") if isinstance(body.get("runs"), list) else [body]
        draw(st.sampled_from(holders or [body]))["input"] = {"a": "x" * (256 * 1024)}
    return json.dumps(body)


BODY_OPERATIONS = sorted(label for label, op in OPERATIONS.items() if op.method == "post")
INPUT_OPERATIONS = {"POST /api/runs/", "POST /api/runs/batch/", "POST /api/runs/{run_id}/resume/"}
QUERY_OPERATIONS = sorted(label for label, op in OPERATIONS.items() if list(op.query))


@pytest.fixture
def operator_client(settings):
    queued, (awaiting, _) = queued_run(), awaiting_run()
    _, review_token = review_link_create(run_id=awaiting.id, actor="fuzz", seconds=3600)
    RUN_IDS.update({"resume": awaiting.id, "other": queued.id, "token": review_token})
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token " + api_key_issue(
        user=make_user("fuzz-operator", "operator")))
    return client


def refused(response) -> None:
    """A documented 4xx JSON error."""
    assert response.status_code in (400, 413), (response.status_code, response.content[:300])
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["code"] in ("invalid", "parse_error", "too_large"), body
    assert isinstance(body["detail"], str) and body["detail"]


@pytest.mark.parametrize("label, kind", [
    pytest.param(label, kind, id=f"{label}-{kind}")
    for label in BODY_OPERATIONS for kind in [*HOSTILE_VALUES, *HOSTILE_SHAPES]
    if kind != "input-over-256-kib" or label in INPUT_OPERATIONS])
def test_hostile_bodies_are_refused_and_change_nothing(label, kind, operator_client):
    operation = OPERATIONS[label]
    run_id = RUN_IDS["resume" if "resume" in label else "other"]
    path = operation.path.replace("{run_id}", str(run_id)).replace("{token}", RUN_IDS["token"])
    before = db_state()

    @given(case=operation.as_strategy(), data=st.data())
    @settings(max_examples=8, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def call(case, data):
        body = case.body if isinstance(case.body, dict) else {}
        text = hostile_body(json.loads(json.dumps(body)), kind, data.draw)
        TRIED[f"hostile {kind}"] += 1
        refused(operator_client.generic("POST", path, text, content_type="application/json"))
        assert db_state() == before

    call()


@pytest.mark.parametrize("label", QUERY_OPERATIONS)
def test_a_nul_in_any_query_parameter_is_refused(label, operator_client):
    operation = OPERATIONS[label]
    path = operation.path.replace("{run_id}", str(RUN_IDS["other"]))
    names = [parameter.name for parameter in operation.query]

    @given(name=st.sampled_from(names), text=st.text(max_size=20), data=st.data())
    @settings(max_examples=20, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def call(name, text, data):
        at = data.draw(st.integers(0, len(text)))
        TRIED["hostile nul-in-query"] += 1
        url = f"{path}?{urlencode({name: text[:at] + chr(0) + text[at:]})}"
        before = db_state()
        refused(operator_client.generic(operation.method.upper(), url, "{}",
                                        content_type="application/json"))
        assert db_state() == before

    call()
