"""The site's settings as a deployment gives them, read by a process of its own."""

import os
import socket
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
from django.db import connection

from tests.conftest import site_command

SHOWN = ("application_name", "statement_timeout", "idle_in_transaction_session_timeout")


@pytest.mark.postgres
def test_the_database_urls_parameters_reach_the_connection_over_the_sites_own(tmp_path):
    # A deployment names TLS, its name in pg_stat_activity and server settings in the URL;
    # the site's own options (the pool, idle_in_transaction_session_timeout) stay beside
    # them, and a setting both give is the URL's.
    server = urlsplit(os.environ["DATABASE_URL"])
    query = ("sslmode=disable&application_name=awaken-probe&options="
             + quote("-c statement_timeout=4321 -c idle_in_transaction_session_timeout=2500"))
    url = urlunsplit((server.scheme, server.netloc, "/postgres", query, ""))
    probe = ("from django.db import connection\n"
             "with connection.cursor() as cursor:\n"
             f"    for name in {SHOWN!r}:\n"
             "        cursor.execute('SHOW ' + name)\n"
             "        print(cursor.fetchone()[0])\n"
             "print(' '.join(sorted(connection.settings_dict['OPTIONS'])))\n")
    result = site_command("shell", "-c", probe, var_dir=tmp_path, DATABASE_URL=url,
                          SECRET_KEY="x" * 50)
    assert result.returncode == 0, result.stderr
    *shown, options = result.stdout.strip().splitlines()[-4:]
    assert shown == ["awaken-probe", "4321ms", "2500ms"]
    assert {"pool", "prepare_threshold", "sslmode"} <= set(options.split())


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_database_connection_asks_the_kernel_to_give_up_on_a_silent_server():
    # A query to a server whose host or network went away would otherwise wait for ever
    # (a request acknowledged, never answered) or some fifteen minutes (one unacknowledged).
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        held = socket.socket(fileno=os.dup(connection.connection.pgconn.socket))
    try:
        assert held.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert [held.getsockopt(socket.IPPROTO_TCP, option) for option in (
            socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT,
            socket.TCP_USER_TIMEOUT)] == [10, 5, 3, 30_000]
    finally:
        held.close()


@pytest.mark.one_backend
@pytest.mark.parametrize(("env", "said"), [
    ({"DB_POOLER": "session"}, "DB_POOLER must be empty or transaction, not 'session'"),
    ({"DB_POOLER": "transaction"}, "DB_POOLER names a PostgreSQL pooler; DATABASE_URL names "
                                   "no PostgreSQL database"),
])
def test_a_pooler_the_site_cannot_run_behind_is_refused_as_it_starts(tmp_path, env, said):
    result = site_command("check", var_dir=tmp_path, SECRET_KEY="x" * 50, **env)
    assert result.returncode != 0
    assert f"ImproperlyConfigured: {said}" in result.stderr
