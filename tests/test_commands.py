import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from runs.domain.keys import key_digest
from runs.domain.roles import is_operator, is_viewer
from runs.models import ApiKey
from tests.conftest import client_for, make_user

pytestmark = pytest.mark.django_db


def token_of(*args) -> str:
    from io import StringIO

    out = StringIO()
    call_command("operator_token", *args, stdout=out)
    return out.getvalue()


def status_with(key: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client.get("/api/runs/").status_code


def test_create_prints_only_the_key_and_makes_an_operator():
    from django.contrib.auth.models import User

    printed = token_of("bot", "--create")
    assert printed.endswith("\n") and printed.count("\n") == 1
    user = User.objects.get(username="bot")
    # It should store the key's digest, never the key.
    stored = ApiKey.objects.get(user=user)
    assert stored.digest == key_digest(printed.strip()) and printed.strip() not in str(
        ApiKey.objects.filter(user=user).values().get())
    assert is_operator(user) and not user.has_usable_password()
    assert status_with(printed.strip()) == 200


def test_each_call_makes_a_new_key_and_the_old_one_stops_working():
    first = token_of("bot", "--create").strip()
    second = token_of("bot").strip()
    assert second != first
    assert status_with(second) == 200
    assert status_with(first) == 401
    assert ApiKey.objects.filter(user__username="bot").count() == 1


def test_the_help_says_that_keys_are_shown_once():
    from runs.management.commands.operator_token import Command

    assert "previous key stops working" in Command.help


def test_a_viewer_token_reads_but_cannot_control():
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


def test_the_benchmark_command_parses_its_options():
    from harness.management.commands.bench import Command as Bench

    parser = Bench().create_parser("manage.py", "bench")  # fails on a clashing option
    options = parser.parse_args(["lifecycle", "--rounds", "3"])
    assert (options.what, options.rounds) == ("lifecycle", 3)


def test_operator_token_runs_the_username_validators():
    from django.contrib.auth.models import User
    from django.core.management.base import CommandError

    token_of("alice", "--create")
    token_of("\uff41\uff4c\uff49\uff43\uff45", "--create")  # full-width "alice": the same user
    assert list(User.objects.values_list("username", flat=True)) == ["alice"]
    with pytest.raises(CommandError, match="username"):
        token_of("no spaces allowed", "--create")
    assert User.objects.count() == 1
