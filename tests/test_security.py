"""Every URL and both sockets check who is asking; production settings pass the deploy check."""

import re
import secrets
import uuid

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve

from tests.conftest import client_for, site_command
from tests.factories import queued_run

pytestmark = pytest.mark.django_db

# The favicon is a redirect to a static file, which every visitor may load.
PUBLIC = {"healthz", "accounts/login/", "metrics", "favicon.ico"}


def routes(patterns=None, prefix=""):
    """Every concrete route of the project, as written in its URLconf."""
    for entry in patterns if patterns is not None else get_resolver().url_patterns:
        if isinstance(entry, URLResolver):
            yield from routes(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern)


# A route whose token is the credential: anyone may call it, and a wrong token is a 404.
BY_TOKEN = {"review/<str:token>/"}


def concrete(route: str, run_id) -> str:
    path = route.lstrip("^").rstrip("$").replace("\\Z", "")
    for name in ("<str:run_id>", "<uuid:run_id>"):
        path = path.replace(name, str(run_id))
    path = path.replace("<str:token>", "not-a-token")
    return "/" + re.sub(r"<(str|uuid):\w+>", str(uuid.UUID(int=1)), path)


def project_routes():
    for route in routes():
        if route.startswith("admin/"):
            continue  # the admin guards itself (staff login); see the admin tests
        yield route


def is_control(route: str) -> bool:
    """An API route that changes something: its view answers POST."""
    view = resolve(concrete(route, uuid.UUID(int=0))).func
    return route.startswith("api/") and hasattr(getattr(view, "cls", None), "post")


GUARDED = [route for route in project_routes()
           if route.rstrip("/") not in {p.rstrip("/") for p in PUBLIC | BY_TOKEN}]
CONTROLS = [route for route in project_routes() if is_control(route)]


def test_the_routes_are_found():
    assert len(GUARDED) >= 12
    assert len(CONTROLS) >= 7  # create, batch, cancel, stop, pause, resume, deliver
    console = {"api/runs/<str:run_id>/rerun/", "api/runs/<str:run_id>/review-links/",
               "api/runs/<str:run_id>/review-links/<str:link_id>/revoke/",
               "api/bulk/", "api/bulk/preview/", "api/bulk/<str:job_id>/abort/"}
    assert console <= set(CONTROLS)
    assert console | {"api/overview/", "api/bulk/<str:job_id>/"} <= set(GUARDED)


@pytest.mark.parametrize("route", sorted(BY_TOKEN))
def test_a_route_by_token_tells_a_wrong_token_nothing(route):
    queued_run()
    for method in ("get", "post"):
        response = getattr(Client(), method)(concrete(route, uuid.UUID(int=0)))
        assert response.status_code == 404, (method, response.status_code)
        assert response.json() == {"code": "not_found", "detail": "No such review link."}


@pytest.mark.parametrize("route", GUARDED, ids=lambda route: "/" + route)
def test_every_url_refuses_anonymous_users(route):
    """GET and POST both: each one answers 405 or sends the visitor to log in, and at least
    one of them does the latter."""
    path = concrete(route, queued_run().id)
    answers = {method: getattr(Client(), method)(path) for method in ("get", "post")}
    refused = {method: response for method, response in answers.items()
               if response.status_code != 405}
    assert refused, f"{path} answers 405 to GET and POST"
    for method, response in refused.items():
        if path.startswith("/api/"):
            assert response.status_code == 401, (method, response.status_code)
        else:
            assert response.status_code == 302, (method, response.status_code)
            assert "/accounts/login/" in response["Location"]


@pytest.mark.parametrize("route", CONTROLS, ids=lambda route: "/" + route)
def test_every_control_refuses_viewers(viewer, route):
    response = client_for(viewer).post(concrete(route, queued_run().id), {}, format="json")
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"


def test_production_settings_pass_the_deploy_check(tmp_path):
    result = site_command("check", "--deploy", "--fail-level", "WARNING", var_dir=tmp_path,
                          DEBUG="0", SECRET_KEY=secrets.token_urlsafe(60),
                          ALLOWED_HOSTS="runs.example.com", SECURE_COOKIES="1",
                          SECURE_SSL_REDIRECT="1", SECURE_HSTS_SECONDS="31536000",
                          SECURE_HSTS_PRELOAD="1", SECURE_HSTS_INCLUDE_SUBDOMAINS="1",
                          BEHIND_TLS_PROXY="1")
    assert result.returncode == 0, result.stdout + result.stderr


def test_hsts_names_subdomains_only_when_asked(settings, tmp_path):
    from django.test import Client

    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = False
    header = Client().get("/healthz", secure=True)["Strict-Transport-Security"]
    assert header == "max-age=3600"
    probe = "from django.conf import settings; print(settings.SECURE_HSTS_INCLUDE_SUBDOMAINS)"
    result = site_command("shell", "-c", probe, var_dir=tmp_path, SECRET_KEY="x",
                          SECURE_HSTS_SECONDS="60")
    assert result.stdout.strip().splitlines()[-1] == "False", result.stderr
