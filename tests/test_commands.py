import pytest
from django.core.management import CommandError, call_command
from rest_framework.authtoken.models import Token

from runs.domain.roles import is_operator, is_viewer
from tests.conftest import client_for, make_user

pytestmark = pytest.mark.django_db


def token_of(*args) -> str:
    from io import StringIO

    out = StringIO()
    call_command("operator_token", *args, stdout=out)
    return out.getvalue()


def test_create_prints_only_the_token_and_makes_an_operator():
    from django.contrib.auth.models import User

    printed = token_of("bot", "--create")
    assert printed.endswith("\n") and printed.count("\n") == 1
    user = User.objects.get(username="bot")
    assert Token.objects.get(user=user).key == printed.strip()
    assert is_operator(user) and not user.has_usable_password()


def test_the_same_token_is_printed_again():
    first = token_of("bot", "--create")
    assert token_of("bot") == first


def test_a_viewer_token_reads_but_cannot_control():
    from rest_framework.test import APIClient

    key = token_of("watcher", "--create", "--role", "viewer").strip()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/runs/").status_code == 200
    assert client.post("/api/runs/", {"agent": "demo.steps"}, format="json").status_code == 403


def test_role_can_be_changed():
    user = make_user("x", "operator")
    token_of("x", "--role", "viewer")
    user = type(user).objects.get(pk=user.pk)  # a fresh object: roles are cached per object
    assert is_viewer(user) and not is_operator(user)
    assert client_for(user).post("/api/runs/", {"agent": "demo.steps"},
                                 format="json").status_code == 403


def test_an_unknown_user_without_create_is_an_error():
    with pytest.raises(CommandError):
        token_of("ghost")


def test_the_migrations_match_the_models():
    from io import StringIO

    # Exits (SystemExit 1) when a model change has no migration.
    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())
