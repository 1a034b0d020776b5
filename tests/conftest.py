import threading

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import connections
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from runs.models import Attempt, ControlIntent, Event, ResumeTicket, Run

ON_POSTGRES = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL=postgres://...)")
    for item in items:
        if "postgres" in item.keywords and not ON_POSTGRES:
            item.add_marker(skip)


def make_user(username: str, role: str | None = None, **extra) -> User:
    user = User.objects.create_user(username=username, password="pw-" + username, **extra)
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


def client_for(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        token, _ = Token.objects.get_or_create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def operator(db):
    return make_user("olga", "operator")


@pytest.fixture
def viewer(db):
    return make_user("victor", "viewer")


@pytest.fixture
def stranger(db):
    return make_user("sam")


@pytest.fixture
def op_client(operator):
    return client_for(operator)


@pytest.fixture
def viewer_client(viewer):
    return client_for(viewer)


@pytest.fixture
def anon_client(db):
    return APIClient()


def db_state() -> dict:
    """Everything a refused request must leave as it was."""
    return {
        "runs": sorted(Run.objects.values_list("id", "state", "version")),
        "attempts": Attempt.objects.count(),
        "tickets": sorted(ResumeTicket.objects.values_list("id", "state")),
        "intents": ControlIntent.objects.count(),
        "events": Event.objects.count(),
    }


class Gang:
    """N long-lived threads, each with its own database connection, released together.

    ``run(fns)`` starts every function at the same instant (a barrier) and returns each
    one's result or raised exception, in order.
    """

    def __init__(self, size: int):
        self.size = size
        self._jobs = [None] * size
        self._results = [None] * size
        self._go = threading.Barrier(size + 1)
        self._done = threading.Barrier(size + 1)
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True)
                         for i in range(size)]
        for thread in self._threads:
            thread.start()

    def _work(self, index: int):
        while True:
            self._go.wait()
            job = self._jobs[index]
            if job is None:
                connections.close_all()
                self._done.wait()
                return
            try:
                self._results[index] = job()
            except Exception as error:  # reported to the caller, not swallowed
                self._results[index] = error
            self._done.wait()

    def run(self, fns: list):
        assert len(fns) == self.size
        self._jobs = list(fns)
        self._go.wait(timeout=60)
        self._done.wait(timeout=60)
        return list(self._results)

    def close(self):
        self._jobs = [None] * self.size
        self._go.wait(timeout=60)
        self._done.wait(timeout=60)


@pytest.fixture
def gang():
    gangs = []

    def make(size: int) -> Gang:
        gangs.append(Gang(size))
        return gangs[-1]

    yield make
    for g in gangs:
        g.close()
