"""API fuzzing with schemathesis against our own OpenAPI document, as an operator and as a
viewer: never a 500, never an answer the document does not describe."""

import json

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from rest_framework.utils.encoders import JSONEncoder
from schemathesis.specs.openapi.checks import positive_data_acceptance

from runs.domain.keys import api_key_issue
from tests.conftest import make_user
from tests.factories import awaiting_run, queued_run

pytestmark = pytest.mark.django_db

DOCUMENT = json.loads(json.dumps(SchemaGenerator().get_schema(request=None, public=True),
                                 cls=JSONEncoder))
SCHEMA = schemathesis.openapi.from_dict(DOCUMENT)
SCHEMA.app = get_wsgi_application()
OPERATIONS = {op.ok().label: op.ok() for op in SCHEMA.get_all_operations()}


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
        # Everything but "valid data must be accepted": an opaque cursor that is well-formed
        # but was never handed out is refused (400), as documented.
        case.call_and_validate(headers={"Authorization": f"Token {token}"},
                               excluded_checks=[positive_data_acceptance])

    call()
