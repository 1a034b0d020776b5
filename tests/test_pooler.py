"""The site behind a transaction pooler: Debian's PgBouncer in ``pool_mode = transaction``,
between processes of the site of their own (``DB_POOLER=transaction``) and the test database.

The pooler is given one server session: every client connection's transactions take turns
on it, so whatever one client leaves on the session (a prepared statement, a cursor, a
setting) is met by the others."""

import pytest
from django.db import connection

from harness.processes import PrivatePgBouncer, database_url
from tests.conftest import site_command

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# Four threads, each on a connection of its own, each taking runs through their lifecycle
# often enough that every statement would be prepared (psycopg prepares at the fifth use).
LIFECYCLES = """
import threading
from django.db import connection
from runs import domain
from runs.domain import attempts
from runs.domain.core import Ending
from runs.models import Run, RunState

failures = []

def lifecycles(number):
    try:
        for _ in range(8):
            run = domain.run_create(agent="demo.steps", dispatch=False, source="cli")[0]
            attempt = attempts.attempt_start(run_id=run.pk, owner=f"probe-{number}",
                                             lease_seconds=30)
            attempts.attempt_step(run_id=run.pk, generation=attempt.generation, tokens=1)
            attempts.attempt_finish(run_id=run.pk, generation=attempt.generation,
                                    ending=Ending.completed({"n": number}))
            queued = domain.run_create(agent="demo.steps", dispatch=False, source="cli")[0]
            domain.run_cancel(run_id=queued.pk, actor="probe", source="cli")
    except Exception as error:
        failures.append(repr(error))
    finally:
        connection.close()

threads = [threading.Thread(target=lifecycles, args=(number,)) for number in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("failures", failures)
causes = list(Run.objects.filter(state=RunState.ENDED).values_list("end_cause", flat=True))
print("ended", {cause: causes.count(cause) for cause in sorted(set(causes))})
"""


@pytest.fixture
def pooler():
    """A PgBouncer of the test's own in transaction mode, one server session for all its
    clients: the test database's URL through it."""
    with PrivatePgBouncer(database_url(), sessions=1) as pgbouncer:
        yield pgbouncer.wait_ready(20).url


def site(tmp_path, *args, url, **env):
    return site_command(*args, var_dir=tmp_path, DATABASE_URL=url, SECRET_KEY="x" * 50,
                        AWAKEN_DEMO_AGENTS="1", DB_POOL_TIMEOUT="3", **env)


def test_behind_a_transaction_pooler_runs_go_through_their_lifecycles(pooler, tmp_path):
    # 64 runs ended by 4 connections taking turns on one server session: no statement of
    # theirs is prepared there (a second client's "_pg3_0" would already exist), and no
    # session setting is asked for (the pooler refuses a connection that gives one).
    result = site(tmp_path, "shell", "-c", LIFECYCLES, url=pooler, DB_POOLER="transaction")
    assert result.returncode == 0, result.stderr
    failures, ended = result.stdout.strip().splitlines()[-2:]
    assert failures == "failures []"
    assert ended == "ended {'cancelled': 32, 'completed': 32}"


def test_without_being_told_of_the_pooler_the_site_is_refused_by_it(pooler, tmp_path):
    result = site(tmp_path, "shell", "-c", "from runs.models import Run; Run.objects.count()",
                  url=pooler)
    assert result.returncode != 0
    assert "unsupported startup parameter: options" in result.stderr


def check(tmp_path, pooler) -> str:
    result = site(tmp_path, "check", "--database", "default", url=pooler,
                  DB_POOLER="transaction")
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


def test_behind_a_pooler_the_database_check_asks_the_server_to_end_idle_transactions(
        pooler, tmp_path):
    # The site cannot set idle_in_transaction_session_timeout through the pooler, and the
    # server leaves it off: migrate's database check says where to set it.
    said = check(tmp_path, pooler)
    assert "awaken.W001" in said
    assert "ALTER ROLE postgres SET idle_in_transaction_session_timeout = '10s'" in said


def test_behind_a_pooler_the_database_check_is_quiet_once_the_server_ends_them(pooler,
                                                                                tmp_path):
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:  # before the pooler opens its server session
        cursor.execute(f'ALTER DATABASE "{name}" SET idle_in_transaction_session_timeout = '
                       "'10s'")
    try:
        said = check(tmp_path, pooler)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" RESET idle_in_transaction_session_timeout')
    assert "System check identified no issues" in said
