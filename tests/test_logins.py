"""Failed logins are throttled (django-axes): per (username, address) pair, answered 429 with
Retry-After and a page that says when to try again, and no password is hashed meanwhile."""

import pytest
from django.contrib.auth.hashers import MD5PasswordHasher
from django.test import Client

from tests.conftest import AUTH_LIMIT as LIMIT
from tests.conftest import AUTH_PERIOD as PERIOD
from tests.conftest import make_user

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("small_auth_limits")]


def login(username: str, password: str, address: str = "10.0.0.1",
          path: str = "/accounts/login/", **headers):
    client = Client(REMOTE_ADDR=address)
    response = client.post(path, {"username": username, "password": password}, **headers)
    response.logged_in = "_auth_user_id" in client.session
    return response


def right(username: str, address: str = "10.0.0.1", **options):
    return login(username, "pw-" + username, address, **options)


def fail(times: int, username: str = "olga", address: str = "10.0.0.1", **options) -> None:
    for _ in range(times):
        response = login(username, "wrong", address, **options)
        assert not response.logged_in and response.status_code in (200, 429)


def test_after_wrong_passwords_the_right_one_is_refused_until_the_period_passes(
        operator, clock):
    fail(LIMIT - 1)
    last = login("olga", "wrong")
    assert last.status_code == 429  # the failure that reaches the limit locks at once
    refused = right("olga")
    assert refused.status_code == 429 and not refused.logged_in
    assert refused["Retry-After"] == str(PERIOD)
    assert refused["Content-Type"].startswith("text/html")
    assert b"Too many failed logins" in refused.content and b"60 seconds" in refused.content
    assert "script-src 'self'" in refused["Content-Security-Policy"]
    clock.shift(PERIOD - 10)
    assert right("olga")["Retry-After"] == "10"
    clock.shift(10)
    allowed = right("olga")
    assert allowed.status_code == 302 and allowed.logged_in


class CountingHasher(MD5PasswordHasher):
    """The tests' hasher, counting the passwords it hashes."""

    calls = 0

    def encode(self, password, salt):
        CountingHasher.calls += 1
        return super().encode(password, salt)


def test_a_locked_login_hashes_no_password(operator, settings, clock):
    settings.PASSWORD_HASHERS = ["tests.test_logins.CountingHasher"]
    make_user("victor", "viewer")
    fail(LIMIT)
    CountingHasher.calls = 0
    assert right("victor", "10.0.0.2").logged_in  # not locked: checked, so hashed
    assert CountingHasher.calls > 0
    CountingHasher.calls = 0
    for attempt in (right("olga"), login("olga", "wrong")):
        assert attempt.status_code == 429
    assert CountingHasher.calls == 0


def test_a_username_locked_from_one_address_logs_in_from_another(operator, clock):
    make_user("victor", "viewer")
    fail(LIMIT)  # a stranger's wrong passwords for olga, from 10.0.0.1
    assert right("olga").status_code == 429
    assert right("olga", "10.0.0.2").logged_in
    assert right("victor").logged_in  # the address is not locked for other usernames


def test_failures_from_many_addresses_lock_no_one(operator, clock):
    for n in range(LIMIT * 2):
        fail(1, address=f"10.0.1.{n}")
    assert right("olga", "10.0.2.1").logged_in


def test_a_forwarded_for_header_does_not_change_the_address(operator, clock):
    for n in range(LIMIT):
        fail(1, HTTP_X_FORWARDED_FOR=f"192.0.2.{n}")
    assert right("olga", HTTP_X_FORWARDED_FOR="192.0.2.99").status_code == 429


def test_the_admin_login_is_throttled_too(clock):
    make_user("ada", "operator", is_staff=True)
    make_user("bea", "operator", is_staff=True)
    fail(LIMIT, "ada", path="/admin/login/")
    refused = right("ada", path="/admin/login/")
    assert refused.status_code == 429 and not refused.logged_in
    assert right("ada", "10.0.0.2", path="/admin/login/").logged_in
    assert right("bea", path="/admin/login/").logged_in


def test_refused_logins_do_not_extend_the_lockout(operator, clock):
    fail(LIMIT)
    for _ in range(10):
        clock.shift(5)
        assert right("olga").status_code == 429
    clock.shift(PERIOD - 50)
    assert right("olga").logged_in
