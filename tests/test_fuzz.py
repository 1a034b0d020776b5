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

from harness.hostile_input import hostile_body, hostile_kinds
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

RUN_IDS = {}  # run_id of each operation's path: a run in the state that reaches its parser

BODY_OPERATIONS = sorted(label for label, op in OPERATIONS.items() if op.method == "post")
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


# A hostile input is refused by the parsers, before any query, and one that got through would
# fail ``refused`` on either backend: these run once (``one_backend``).
@pytest.mark.one_backend
@pytest.mark.parametrize("label, kind", [
    pytest.param(label, kind, id=f"{label}-{kind}")
    for label in BODY_OPERATIONS for kind in hostile_kinds(label)])
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


@pytest.mark.one_backend
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
