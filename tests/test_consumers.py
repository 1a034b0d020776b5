"""The websocket protocol of API.md: who may connect, the snapshot, pushes, and resume."""


import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from awaken_site.asgi import application
from runs import domain as services
from runs.models import Event
from tests.conftest import api_key_for, browser_for, make_user
from tests.factories import queued_run

# Transactional: the consumers' database calls close and reopen connections, as they do
# in production, which a test wrapped in one transaction cannot survive on PostgreSQL. The
# services' on-commit broadcasts then run for real.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    # The protocol is under test here; the Redis layer is exercised by the execution tests
    # (their waiting API calls) and by `manage.py bench push`.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

ORIGIN = (b"origin", b"http://127.0.0.1")


def session_cookie(user) -> tuple:
    client = browser_for(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


def token_header(user) -> tuple:
    return (b"authorization", f"Token {api_key_for(user)}".encode())


def run_async(coroutine_function):
    """Run an async test body; database calls in it use the test's transaction."""
    return async_to_sync(coroutine_function)()


async def connect(path, headers):
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await communicator.connect(timeout=5)
    return communicator, connected, code


@pytest.mark.parametrize("who, headers, allowed", [
    ("viewer", ["session", "origin"], True),
    ("viewer", ["token"], True),
    ("viewer", ["token", "evil-origin"], True),
    ("viewer", ["session"], False),  # a browser must send an allowed Origin
    ("viewer", ["session", "evil-origin"], False),
    ("stranger", ["session", "origin"], False),  # a user without a role
    ("anonymous", ["origin"], False),
    ("bad-token", ["bad-token"], False),
], ids=lambda value: "-".join(value) if isinstance(value, list) else None)
def test_who_may_connect(who, headers, allowed):
    user = None if who in ("anonymous", "bad-token") else make_user(
        who, "viewer" if who == "viewer" else None)
    parts = {"session": lambda: session_cookie(user), "token": lambda: token_header(user),
             "origin": lambda: ORIGIN, "evil-origin": lambda: (b"origin", b"http://evil.test"),
             "bad-token": lambda: (b"authorization", b"Token nope")}
    header_list = [parts[name]() for name in headers]

    async def body():
        communicator, connected, _ = await connect("/ws/runs/", header_list)
        assert connected is allowed
        await communicator.disconnect()

    run_async(body)


def test_snapshot_then_pushes_in_seq_order(viewer):
    first = queued_run()

    headers = [token_header(viewer)]

    async def body():
        communicator, connected, _ = await connect("/ws/runs/", headers)
        assert connected
        snapshot = await communicator.receive_json_from(timeout=5)
        assert snapshot["type"] == "snapshot"
        assert [run["id"] for run in snapshot["runs"]] == [str(first.id)]
        assert snapshot["seq"] == await database_sync_to_async(
            lambda: Event.objects.latest("seq").seq)()

        def transitions():
            run = queued_run()
            services.run_cancel(run_id=run.id, actor="olga", source="api")
            return run

        run = await database_sync_to_async(transitions)()
        pushed = [await communicator.receive_json_from(timeout=5) for _ in range(3)]
        assert [p["type"] for p in pushed] == ["run.changed"] * 3
        assert [p["event"]["kind"] for p in pushed] == ["created", "cancel_requested", "ended"]
        assert [p["seq"] for p in pushed] == sorted(p["seq"] for p in pushed)
        assert all(p["run"]["id"] == str(run.id) for p in pushed)
        assert pushed[-1]["run"]["end_cause"] == "cancelled"
        await communicator.disconnect()

    run_async(body)


def test_one_runs_socket_gets_only_that_run(viewer):
    mine, other = queued_run(), queued_run()

    headers = [token_header(viewer)]

    async def body():
        communicator, connected, _ = await connect(f"/ws/runs/{mine.id}/", headers)
        assert connected
        snapshot = await communicator.receive_json_from(timeout=5)
        assert [run["id"] for run in snapshot["runs"]] == [str(mine.id)]

        def cancel_both():
            for run in (other, mine):
                services.run_cancel(run_id=run.id, actor="olga", source="api")

        await database_sync_to_async(cancel_both)()
        pushed = [await communicator.receive_json_from(timeout=5) for _ in range(2)]
        assert {p["run"]["id"] for p in pushed} == {str(mine.id)}
        assert await communicator.receive_nothing(timeout=0.2)
        await communicator.disconnect()

    run_async(body)


@pytest.mark.parametrize("path", ["/ws/runs/00000000-0000-0000-0000-000000000000/",
                                  "/ws/runs/not-a-uuid/"])
def test_a_socket_for_an_unknown_run_is_refused(viewer, path):
    headers = [token_header(viewer)]

    async def body():
        _, connected, _ = await connect(path, headers)
        assert not connected

    run_async(body)


def test_resume_replays_the_committed_events_after_seq(viewer):
    run = queued_run()
    seen = Event.objects.latest("seq").seq
    services.run_cancel(run_id=run.id, actor="olga", source="api")
    later = queued_run()
    expected = list(Event.objects.filter(seq__gt=seen).order_by("seq")
                    .values_list("seq", flat=True))

    headers = [token_header(viewer)]

    async def body():
        communicator, _, _ = await connect("/ws/runs/", headers)
        await communicator.receive_json_from(timeout=5)  # the snapshot
        await communicator.send_json_to({"type": "resume", "after": seen})
        replayed = []
        while not replayed or replayed[-1]["seq"] != expected[-1]:
            replayed.append(await communicator.receive_json_from(timeout=5))
        assert await communicator.receive_nothing(timeout=0.1)
        # The replay window may start a little before `seen` (commit order is not seq
        # order); everything after it comes, once, in order, with the run as it is now.
        seqs = [m["seq"] for m in replayed if m["seq"] > seen]
        assert seqs == expected
        ended = [m for m in replayed if m["event"]["kind"] == "ended"][0]
        assert ended["run"]["end_cause"] == "cancelled"
        assert any(m["run"]["id"] == str(later.id) for m in replayed)
        await communicator.disconnect()

    run_async(body)


@pytest.mark.parametrize("message", ['{"type": "resume"}', '{"type": "resume", "after": -1}',
                                     "not json", '{"type": "shout"}'])
def test_a_bad_client_message_gets_an_error_and_changes_nothing(viewer, message):
    queued_run()
    headers = [token_header(viewer)]

    async def body():
        communicator, _, _ = await connect("/ws/runs/", headers)
        await communicator.receive_json_from(timeout=5)
        await communicator.send_to(text_data=message)
        answer = await communicator.receive_json_from(timeout=5)
        assert answer["type"] == "error" and answer["code"] == "invalid"
        await communicator.disconnect()

    before = Event.objects.count()
    run_async(body)
    assert Event.objects.count() == before


@pytest.mark.parametrize("path", [pytest.param("/ws/runs/", id="every-run"),
                                  pytest.param("/ws/runs/{run_id}/", id="one-run")])
def test_each_socket_refuses_anonymous_users(path):
    run = queued_run()

    async def body():
        _, connected, _ = await connect(path.format(run_id=run.id), [ORIGIN])
        assert not connected

    run_async(body)
