"""API keys: kept as digests, shown once (command and admin), carried over from DRF's plain
tokens, and checks of unknown keys throttled per address (never a right key), on the REST API
and the socket handshake alike."""

import http.cookiejar
import re
import secrets
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from rest_framework.test import APIClient

from awaken_site.asgi import application
from runs.domain.keys import api_key_issue, key_digest, user_for_api_key
from runs.domain.roles import is_operator, is_viewer
from runs.domain.throttle import failure_record
from runs.models import ApiKey, AuthFailure, AuthScope
from tests.conftest import AUTH_LIMIT as LIMIT
from tests.conftest import AUTH_PERIOD as PERIOD
from tests.conftest import HAS_SERVICES, browser_for, db_state, make_user
from tests.factories import queued_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("small_auth_limits")]


@pytest.fixture
def key(operator):
    return api_key_issue(user=operator)


def call(key: str, address: str = "10.0.0.1", **headers):
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}", **headers)
    return client.get("/api/runs/")


def wrong_key(prefix: str = "") -> str:
    return prefix + secrets.token_urlsafe(32)[len(prefix):]


def fail(times: int, address: str = "10.0.0.1", prefix: str = "") -> None:
    for _ in range(times):
        assert call(wrong_key(prefix), address).status_code == 401


# Stored hashed, shown once


def test_a_key_is_stored_as_its_digest_only(operator):
    key = api_key_issue(user=operator)
    row = ApiKey.objects.filter(user=operator).values().get()
    assert row["digest"] == key_digest(key) and row["prefix"] == key[:8]
    assert not any(key in str(value) for value in row.values())
    assert len(key) >= 43  # 32 random bytes


def test_a_new_key_replaces_the_old_one(operator):
    old = api_key_issue(user=operator)
    new = api_key_issue(user=operator)
    assert call(new).status_code == 200
    assert call(old, "10.0.0.2").status_code == 401


def test_a_right_key_is_checked_with_its_roles_in_one_query(
        operator, viewer, django_assert_num_queries):
    for user, operates in ((operator, True), (viewer, False)):
        key = api_key_issue(user=user)
        with django_assert_num_queries(1):
            found = user_for_api_key(key=key, address="10.0.0.1")
            assert (is_operator(found), is_viewer(found)) == (operates, True)


@pytest.fixture
def superuser_browser(db):
    return browser_for(make_user("root", is_staff=True, is_superuser=True))


def make_keys_in_admin(browser, *users):
    return browser.post("/admin/auth/user/", {
        "action": "make_api_keys", "_selected_action": [str(user.pk) for user in users]})


def test_the_admin_makes_a_key_and_shows_it_once(superuser_browser, operator):
    page = make_keys_in_admin(superuser_browser, operator)
    assert page.status_code == 200
    assert "no-store" in page["Cache-Control"]
    (shown,) = re.findall(r'<code class="api-key">([^<]+)</code>', page.content.decode())
    assert call(shown).status_code == 200
    # It should show the key on that page only: the key list shows its prefix, not the key.
    listing = superuser_browser.get("/admin/runs/apikey/").content.decode()
    assert shown[:8] in listing and shown not in listing
    again = make_keys_in_admin(superuser_browser, operator).content.decode()
    assert shown not in again
    assert call(shown, "10.0.0.2").status_code == 401


def test_staff_who_may_not_change_users_cannot_make_keys(operator):
    staff = browser_for(make_user("ada", "operator", is_staff=True))
    make_keys_in_admin(staff, operator)
    assert not ApiKey.objects.filter(user=operator).exists()


@pytest.mark.django_db(transaction=True)
def test_plain_drf_tokens_are_migrated_to_digests():
    user = make_user("scripted", "operator")
    plain = secrets.token_hex(20)  # what DRF's authtoken made: 40 hex digits
    executor = MigrationExecutor(connection)
    executor.migrate([("runs", "0007_intent_caused_by")])
    try:
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
                           "created timestamp NOT NULL, user_id integer NOT NULL)")
            cursor.execute("INSERT INTO authtoken_token VALUES (%s, %s, %s)",
                           [plain, "2025-01-02 03:04:05", user.pk])
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM authtoken_token")
            assert cursor.fetchone() == (0,)  # no plain key is left
    finally:
        MigrationExecutor(connection).migrate(
            MigrationExecutor(connection).loader.graph.leaf_nodes())
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS authtoken_token")
    stored = ApiKey.objects.get(user=user)
    assert stored.digest == key_digest(plain)
    assert stored.created_at == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert call(plain).status_code == 200


# Throttled failures


def test_wrong_keys_from_one_address_are_refused_429_but_a_right_one_is_let_in(key, clock):
    fail(LIMIT)
    before = db_state()
    response = call(wrong_key())
    assert response.status_code == 429
    assert response.json()["code"] == "throttled" and response.json()["detail"]
    assert response["Retry-After"] == str(PERIOD)
    assert db_state() == before
    assert call(key).status_code == 200  # the lock falls on what failed, not the good key


def test_a_locked_address_locks_no_other_address(key, clock):
    fail(LIMIT, "10.0.0.1")
    assert call(wrong_key(), "10.0.0.1").status_code == 429
    assert call(wrong_key(), "10.0.0.2").status_code == 401


def test_the_lockout_ends_a_period_after_the_last_failure(clock):
    fail(LIMIT - 1)
    clock.shift(PERIOD / 2)
    fail(1)
    clock.shift(PERIOD - 1)
    response = call(wrong_key())
    assert response.status_code == 429 and response["Retry-After"] == "1"
    clock.shift(1)
    assert call(wrong_key()).status_code == 401


def test_failures_a_period_apart_do_not_add_up(clock):
    for _ in range(LIMIT + 2):
        fail(1)
        clock.shift(PERIOD)
    assert call(wrong_key()).status_code == 401


def test_refused_checks_are_not_counted_and_do_not_extend_the_lockout(clock):
    fail(LIMIT)
    for _ in range(20):
        clock.shift(1)
        assert call(wrong_key()).status_code == 429
    assert AuthFailure.objects.get(scope=AuthScope.ADDRESS, ident="10.0.0.1").failures == LIMIT
    clock.shift(PERIOD - 20)
    assert call(wrong_key()).status_code == 401


def test_a_key_prefix_never_locks_the_key(key, clock):
    for n in range(LIMIT * 2):
        fail(1, f"10.0.1.{n}", prefix=key[:8])
    assert call(key, "10.0.2.1").status_code == 200
    assert set(AuthFailure.objects.values_list("scope", flat=True)) == {AuthScope.ADDRESS}


def test_a_replaced_or_deactivated_key_is_reported_revoked_and_not_counted(operator, clock):
    old = api_key_issue(user=operator)
    new = api_key_issue(user=operator)
    for _ in range(LIMIT * 2):  # a script left running with the old key
        response = call(old)
        assert response.status_code == 401
        assert response.json()["code"] == "authentication_failed"
        assert "revoked" in response.json()["detail"]
    assert not AuthFailure.objects.exists()
    assert call(wrong_key()).status_code == 401  # not locked: nothing was counted
    operator.is_active = False
    operator.save()
    assert "deactivated" in call(new).json()["detail"]
    assert AuthFailure.objects.get().failures == 1


def test_a_forwarded_for_header_does_not_change_the_address(clock):
    for n in range(LIMIT):
        assert call(wrong_key(), HTTP_X_FORWARDED_FOR=f"192.0.2.{n}").status_code == 401
    assert call(wrong_key(), HTTP_X_FORWARDED_FOR="192.0.2.99").status_code == 429


def test_a_malformed_key_counts_against_the_address(clock):
    for bad in ("nope", "x" * 200, "not/a+key=" * 4):
        assert call(bad).status_code == 401
    assert call(wrong_key()).status_code == 429


def test_idle_counts_are_deleted(clock):
    fail(1, "10.0.0.1")
    clock.shift(PERIOD + 1)
    fail(1, "10.0.0.2")
    assert set(AuthFailure.objects.filter(scope=AuthScope.ADDRESS).values_list(
        "ident", flat=True)) == {"10.0.0.2"}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_failures_at_the_same_instant_all_count(gang):
    threads = gang(6)
    rounds = 8
    for n in range(rounds):  # a new address each round: every round races to insert
        idents = [(AuthScope.ADDRESS, f"10.0.9.{n}")]
        assert threads.run([lambda idents=idents: failure_record(idents)] * 6) == [None] * 6
    assert sorted(AuthFailure.objects.values_list("failures", flat=True)) == [6] * rounds


def from_address(address: str):
    """The ASGI application, as if every connection came from ``address``."""
    async def app(scope, receive, send):
        return await application({**scope, "client": [address, 50000]}, receive, send)
    return app


def socket_connects(key: str, address: str) -> bool:
    async def body():
        communicator = WebsocketCommunicator(from_address(address), "/ws/runs/",
                                             headers=[(b"authorization", f"Token {key}".encode())])
        connected, _ = await communicator.connect(timeout=5)
        await communicator.disconnect()
        return connected

    return async_to_sync(body)()


# Transactional, as in tests/test_consumers.py: the consumer closes and reopens connections.
@pytest.mark.django_db(transaction=True)
def test_the_socket_handshake_checks_keys_with_the_same_throttle(key, clock):
    queued_run()
    assert socket_connects(key, "10.0.3.1")
    for _ in range(LIMIT):
        assert not socket_connects(wrong_key(), "10.0.3.1")
    assert call(wrong_key(), "10.0.3.1").status_code == 429  # the REST API counts them too
    assert socket_connects(key, "10.0.3.1")  # a right key is let in from a locked address


def login_status(base: str, username: str, password: str) -> int:
    """A login through the form of the site at ``base``, as a browser does it."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{base}/accounts/login/", timeout=10).read()
    csrf = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
    form = urllib.parse.urlencode({"username": username, "password": password,
                                   "csrfmiddlewaretoken": csrf}).encode()
    try:
        return opener.open(f"{base}/accounts/login/", form, timeout=10).status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.skipif(not HAS_SERVICES, reason="needs PostgreSQL and Redis for a web process")
@pytest.mark.django_db(transaction=True)
def test_failures_counted_here_lock_keys_and_logins_in_another_web_process(key):
    from harness.processes import Processes, Web

    with Processes() as processes:
        web = processes.add(Web(extra_env={"AWAKEN_AUTH_FAILURES": str(LIMIT),
                                           "AWAKEN_AUTH_LOCKOUT_SECONDS": str(PERIOD)}))
        processes.wait_ready(30)
        assert web.call("GET", "/api/runs/", token=key)[0] == 200
        fail(LIMIT, "127.0.0.1")
        status, body = web.call("GET", "/api/runs/", token=wrong_key())
        assert (status, body["code"]) == (429, "throttled")
        assert web.call("GET", "/api/runs/", token=key)[0] == 200

        for _ in range(LIMIT):
            Client(REMOTE_ADDR="127.0.0.1").post(
                "/accounts/login/", {"username": "olga", "password": "wrong"})
        assert login_status(web.base, "olga", "pw-olga") == 429
