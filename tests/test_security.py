"""Every URL and both sockets check who is asking; production settings pass the deploy check."""

import os
import re
import secrets
import subprocess
import sys

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve

from harness.processes import ROOT
from tests.conftest import client_for
from tests.factories import queued_run

pytestmark = pytest.mark.django_db

PUBLIC = {"healthz", "accounts/login/", "metrics"}


def routes(patterns=None, prefix=""):
    """Every concrete route of the project, as written in its URLconf."""
    for entry in patterns if patterns is not None else get_resolver().url_patterns:
        if isinstance(entry, URLResolver):
            yield from routes(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern)


def concrete(route: str, run_id) -> str:
    path = route.lstrip("^").rstrip("$").replace("\\Z", "")
    for name in ("<str:run_id>", "<uuid:run_id>"):
        path = path.replace(name, str(run_id))
    return "/" + path


def project_routes():
    for route in routes():
        if route.startswith("admin/") or "<" in re.sub(r"<(str|uuid):run_id>", "", route):
            continue  # the admin guards itself (staff login); see the admin tests
        yield route


def test_every_url_refuses_anonymous_users():
    run = queued_run()
    checked = 0
    for route in project_routes():
        path = concrete(route, run.id)
        if route.rstrip("/") in {p.rstrip("/") for p in PUBLIC}:
            continue
        for method in ("get", "post"):
            response = getattr(Client(), method)(path)
            if path.startswith("/api/"):
                assert response.status_code in (401, 405), (method, path, response.status_code)
                if response.status_code == 401:
                    checked += 1
            else:
                assert response.status_code in (302, 405), (method, path, response.status_code)
                if response.status_code == 302:
                    assert "/accounts/login/" in response["Location"]
                    checked += 1
    assert checked >= 12


def test_every_control_refuses_viewers(viewer):
    run = queued_run()
    client = client_for(viewer)
    controls = [r for r in project_routes() if r.startswith("api/") and
                hasattr(getattr(resolve(concrete(r, run.id)).func, "cls", None), "post")]
    assert len(controls) >= 7  # create, batch, cancel, stop, pause, resume, deliver
    for route in controls:
        response = client.post(concrete(route, run.id), {}, format="json")
        assert response.status_code == 403, route
        assert response.json()["code"] == "permission_denied"


def test_production_settings_pass_the_deploy_check():
    env = {"PATH": os.environ["PATH"], "DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(60),
           "ALLOWED_HOSTS": "runs.example.com", "SECURE_COOKIES": "1",
           "SECURE_SSL_REDIRECT": "1", "SECURE_HSTS_SECONDS": "31536000",
           "SECURE_HSTS_PRELOAD": "1", "BEHIND_TLS_PROXY": "1",
           "DJANGO_SETTINGS_MODULE": "awaken_site.settings",
           "AWAKEN_VAR_DIR": os.environ.get("TMPDIR", "/tmp")}
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy",
                             "--fail-level", "WARNING"], cwd=ROOT, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
