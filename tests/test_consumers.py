"""The websocket protocol of API.md: who may connect, the snapshot, pushes, and resume."""

import json

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.db import connection
from django.middleware.csrf import CsrfViewMiddleware
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from awaken_site.asgi import application
from runs import domain
from runs.changes.stream import stream
from runs.domain import selectors
from runs.domain.keys import api_key_issue
from runs.domain.representation import SNAPSHOT_BYTES
from runs.domain.selectors import SNAPSHOT_SIZE
from runs.models import ApiKey, Event
from runs.sockets.recheck import rechecks
from tests.conftest import api_key_for, browser_for, make_user
from tests.factories import queued_run

# Transactional: the consumers' database calls close and reopen connections, as they do
# in production, which a test wrapped in one transaction cannot survive on PostgreSQL. The
# the domain's on-commit broadcasts then run for real.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    # The protocol is under test here; the Redis layer is exercised by the execution tests
    # (their waiting API calls) and by `manage.py bench push`.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

HOST = (b"host", b"127.0.0.1")
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
    header_list = [HOST, *(parts[name]() for name in headers)]

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
            domain.run_cancel(run_id=run.id, actor="olga", source="api")
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
                domain.run_cancel(run_id=run.id, actor="olga", source="api")

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
    domain.run_cancel(run_id=run.id, actor="olga", source="api")
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


@pytest.mark.parametrize("path", [pytest.param("/ws/runs/", id="every-run"),
                                  pytest.param("/ws/runs/{run_id}/", id="one-run")])
def test_each_socket_refuses_anonymous_users(path):
    run = queued_run()

    async def body():
        _, connected, _ = await connect(path.format(run_id=run.id), [HOST, ORIGIN])
        assert not connected

    run_async(body)


def csrf_allows(origin: str, host: str, secure: bool, meta: dict) -> bool:
    """Whether Django's CSRF check lets a POST with this Origin through (its token valid)."""
    secret = "a" * 32
    request = RequestFactory().post("/", secure=secure, HTTP_HOST=host, HTTP_ORIGIN=origin,
                                    HTTP_X_CSRFTOKEN=secret, **meta)
    request.COOKIES[django_settings.CSRF_COOKIE_NAME] = secret
    view = lambda request: None  # noqa: E731
    return CsrfViewMiddleware(view).process_view(request, view, (), {}) is None


PROXY = {"SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https")}
TRUSTED = {"CSRF_TRUSTED_ORIGINS": ["https://runs.example.com", "https://*.example.org"]}


@pytest.mark.parametrize("origin, host, scheme, proxy_proto, overrides, allowed", [
    ("http://127.0.0.1", "127.0.0.1", "ws", None, {}, True),
    ("http://127.0.0.1:8000", "127.0.0.1:8000", "ws", None, {}, True),
    ("http://127.0.0.1:9999", "127.0.0.1", "ws", None, {}, False),  # another port
    ("http://127.0.0.1", "127.0.0.1:8000", "ws", None, {}, False),
    ("https://127.0.0.1", "127.0.0.1", "ws", None, {}, False),  # another scheme
    ("http://127.0.0.1", "127.0.0.1", "wss", None, {}, False),
    ("https://127.0.0.1", "127.0.0.1", "wss", None, {}, True),
    ("http://localhost", "127.0.0.1", "ws", None, {}, False),  # another allowed host
    ("http://evil.test", "evil.test", "ws", None, {}, False),  # not in ALLOWED_HOSTS
    ("null", "127.0.0.1", "ws", None, {}, False),
    ("https://127.0.0.1", "127.0.0.1", "ws", "https", PROXY, True),  # behind a TLS proxy
    ("http://127.0.0.1", "127.0.0.1", "ws", "https", PROXY, False),
    ("https://runs.example.com", "127.0.0.1", "ws", None, TRUSTED, True),
    ("http://runs.example.com", "127.0.0.1", "ws", None, TRUSTED, False),
    ("https://a.example.org", "127.0.0.1", "ws", None, TRUSTED, True),
    ("https://a.example.org:8443", "127.0.0.1", "ws", None, TRUSTED, False),
    ("https://example.org.evil.test", "127.0.0.1", "ws", None, TRUSTED, False),
], ids=lambda value: ("proxy" if value is PROXY else "trusted" if value is TRUSTED else "-")
    if isinstance(value, dict) else None)
def test_a_browser_socket_needs_the_origin_django_csrf_would_accept(
        viewer, settings, origin, host, scheme, proxy_proto, overrides, allowed):
    for name, value in overrides.items():
        setattr(settings, name, value)
    headers = [(b"host", host.encode()), (b"origin", origin.encode()), session_cookie(viewer)]
    meta = {}
    if proxy_proto is not None:
        headers.append((b"x-forwarded-proto", proxy_proto.encode()))
        meta["HTTP_X_FORWARDED_PROTO"] = proxy_proto
    assert csrf_allows(origin, host, scheme == "wss", meta) is allowed

    async def body():
        communicator = WebsocketCommunicator(application, "/ws/runs/", headers=headers)
        # The scope is read when the application first runs, after this line.
        communicator.scope["scheme"] = scheme
        connected, _ = await communicator.connect(timeout=5)
        assert connected is allowed
        await communicator.disconnect()

    run_async(body)


@pytest.mark.parametrize("path", ["/ws/nothing/", "/ws/", "/ws/runs/a/b/", "/"])
def test_an_unknown_socket_path_is_refused_at_the_handshake(viewer, path):
    headers = [token_header(viewer)]

    async def body():
        _, connected, _ = await connect(path, headers)
        assert not connected

    run_async(body)


BAD_MESSAGES = ["[]", "5", '"x"', "null", '{"type":"resume","after":1e400}',
                "[" * 100_000 + "]" * 100_000, '{"type": "resume", "after": 1.5}',
                '{"type": "resume", "after": true}', '{"type": "resume", "after": "3"}',
                '{"type": "resume", "after": NaN}', f'{{"type": "resume", "after": {2**64}}}',
                '{"type": "resume", "after": 1, "extra": 2}', '{"type": ["resume"]}',
                '{"type": "resume", "after": -1}', '{"type": "resume"}', "not json",
                '{"type": "shout"}', " ", "x" * 2_000_000]


@pytest.mark.parametrize("message", BAD_MESSAGES, ids=lambda message: message[:40])
def test_a_bad_client_message_gets_an_error_and_the_socket_stays_usable(viewer, message):
    queued_run()
    headers = [token_header(viewer)]
    seq = Event.objects.latest("seq").seq

    async def body():
        communicator, _, _ = await connect("/ws/runs/", headers)
        await communicator.receive_json_from(timeout=5)
        await communicator.send_to(text_data=message)
        answer = await communicator.receive_json_from(timeout=5)
        assert answer["type"] == "error" and answer["code"] == "invalid"
        assert isinstance(answer["detail"], str) and answer["detail"]
        await communicator.send_json_to({"type": "resume", "after": seq - 1})
        replayed = None
        while replayed is None or replayed["seq"] != seq:
            replayed = await communicator.receive_json_from(timeout=5)
            assert replayed["type"] == "run.changed"
        await communicator.disconnect()

    before = Event.objects.count()
    run_async(body)
    assert Event.objects.count() == before


def test_a_binary_frame_gets_an_error(viewer):
    headers = [token_header(viewer)]

    async def body():
        communicator, _, _ = await connect("/ws/runs/", headers)
        await communicator.receive_json_from(timeout=5)
        await communicator.send_to(bytes_data=b'{"type": "resume", "after": 0}')
        answer = await communicator.receive_json_from(timeout=5)
        assert answer["type"] == "error" and answer["code"] == "invalid"
        await communicator.disconnect()

    run_async(body)


def test_a_socket_leaves_the_change_stream_however_it_ends(viewer, monkeypatch):
    headers = [token_header(viewer)]

    def broken(**kwargs):
        raise RuntimeError("the replay broke")

    async def body():
        before, watched = stream.followers(), rechecks.checked()
        closed, _, _ = await connect("/ws/runs/", headers)
        await closed.receive_json_from(timeout=5)
        crashed, _, _ = await connect("/ws/runs/", headers)
        await crashed.receive_json_from(timeout=5)
        assert stream.followers() == before + 2
        assert rechecks.checked() == watched + 2

        await closed.disconnect()
        assert stream.followers() == before + 1

        monkeypatch.setattr(selectors, "replay", broken)
        await crashed.send_json_to({"type": "resume", "after": 0})
        with pytest.raises(RuntimeError, match="the replay broke"):
            await crashed.receive_output(timeout=5)
        assert stream.followers() == before
        assert rechecks.checked() == watched

    run_async(body)


def test_a_run_too_large_to_push_whole_is_pushed_truncated(viewer):
    big = {"blob": "x" * 200_000}  # over the push limit, within the input limit
    run = queued_run(input=big)
    small = queued_run(input={"steps": 1})
    headers = [token_header(viewer)]

    def runs_of(text: str) -> dict:
        assert len(text.encode()) <= SNAPSHOT_BYTES < 1024 * 1024  # daphne's message limit
        message = json.loads(text)
        return {r["id"]: r for r in message["runs"]} if "runs" in message else {
            message["run"]["id"]: message["run"]}

    async def body():
        communicator, _, _ = await connect("/ws/runs/", headers)
        snapshot = runs_of(await communicator.receive_from(timeout=5))
        assert snapshot[str(run.id)]["truncated"] is True
        assert "input" not in snapshot[str(run.id)] and "output" not in snapshot[str(run.id)]
        assert snapshot[str(small.id)]["input"] == {"steps": 1}
        assert "truncated" not in snapshot[str(small.id)]

        await database_sync_to_async(domain.run_cancel)(run_id=run.id, actor="olga",
                                                          source="api")
        for _ in range(2):  # cancel_requested, ended
            pushed = runs_of(await communicator.receive_from(timeout=5))[str(run.id)]
            assert pushed["truncated"] is True and "input" not in pushed

        await communicator.send_json_to({"type": "resume", "after": 0})
        for _ in range(await database_sync_to_async(Event.objects.count)()):
            replayed = runs_of(await communicator.receive_from(timeout=5))
            assert replayed.get(str(run.id), {}).get("truncated", True) is True
        await communicator.disconnect()

    run_async(body)


def test_a_snapshot_or_a_replay_never_loads_the_input_of_a_run_too_large_to_push():
    """A socket asking for replays over and over must not have the web process load large
    inputs over and over, only to leave them out."""
    large = queued_run(input={"blob": "x" * 200_000})
    domain.run_cancel(run_id=large.id, actor="olga", source="api")
    small = queued_run(input={"steps": 1})
    with CaptureQueriesContext(connection) as queries:
        snapshot = json.loads(selectors.socket_snapshot())
        replayed = [json.loads(text)["run"] for text in selectors.replay(after=0)]
    runs = {run["id"]: run for run in snapshot["runs"]}
    assert runs[str(large.id)]["truncated"] is True
    assert runs[str(small.id)]["input"] == {"steps": 1}
    assert replayed and all(run["truncated"] for run in replayed if run["id"] == str(large.id))
    # The payloads are read only by the query that measures them first, in the database.
    reads = [query["sql"] for query in queries if '"input"' in query["sql"]]
    assert reads and all("LENGTH(" in sql for sql in reads), reads


def test_the_snapshot_fits_however_large_its_runs(viewer):
    # Each run just under the limit of one run: together, far over a message's limit.
    blob = "x" * (django_settings.AWAKEN_PUSH_RUN_BYTES - 2000)
    ids = [str(queued_run(input={"blob": blob}).id) for _ in range(SNAPSHOT_SIZE)]
    headers = [token_header(viewer)]

    async def body():
        communicator, _, _ = await connect("/ws/runs/", headers)
        text = await communicator.receive_from(timeout=5)
        assert len(text.encode()) <= SNAPSHOT_BYTES
        runs = json.loads(text)["runs"]
        assert {r["id"] for r in runs} == set(ids)
        whole = [r for r in runs if "truncated" not in r]
        assert whole and all(r["input"] == {"blob": blob} for r in whole)
        assert all("input" not in r for r in runs if r.get("truncated"))
        await communicator.disconnect()

    run_async(body)


def test_a_waiting_call_gets_a_large_run_whole(operator):
    big = {"blob": "x" * 200_000}
    run = queued_run(input=big)
    with stream.watch(run.id) as watch:
        domain.run_cancel(run_id=run.id, actor="olga", source="api")
        pushed = watch.next(timeout=5)
    assert pushed["input"] == big and "truncated" not in pushed


def revoke_pass(user, browser, how: str) -> None:
    if how == "logout":
        browser.logout()
    elif how == "deactivated":
        user.is_active = False
        user.save(update_fields=["is_active"])
    elif how == "role-removed":
        user.groups.clear()
    elif how == "password-changed":
        user.set_password("another-password")
        user.save(update_fields=["password"])
    elif how == "key-revoked":
        ApiKey.objects.filter(user=user).delete()
    elif how == "key-replaced":
        api_key_issue(user=user)


# On PostgreSQL: the re-checks read the user's rows from a thread of their own every 0.1 s
# while the test writes them, which SQLite's shared cache of the test database refuses
# ("database table is locked") where a real database serves both.
@pytest.mark.postgres
@pytest.mark.parametrize("how, credential", [
    ("logout", "session"), ("deactivated", "session"), ("role-removed", "session"),
    ("password-changed", "session"), ("deactivated", "token"), ("key-revoked", "token"),
    ("key-replaced", "token"),
])
def test_a_socket_is_closed_once_its_pass_no_longer_holds(viewer, settings, how, credential):
    settings.AWAKEN_SOCKET_RECHECK_SECONDS = 0.1
    browser = browser_for(viewer)
    cookie = (b"cookie", f"sessionid={browser.cookies['sessionid'].value}".encode())
    headers = [HOST, ORIGIN, cookie] if credential == "session" else [token_header(viewer)]

    async def body():
        followers, watched = stream.followers(), rechecks.checked()
        communicator, connected, _ = await connect("/ws/runs/", headers)
        assert connected
        await communicator.receive_json_from(timeout=5)
        # Several checks pass while the pass holds.
        assert await communicator.receive_nothing(timeout=0.5)
        await database_sync_to_async(revoke_pass)(viewer, browser, how)
        closed = await communicator.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4003}
        assert stream.followers() == followers
        assert rechecks.checked() == watched
        await communicator.disconnect()

    run_async(body)


def test_a_flood_of_resumes_costs_one_replay(viewer):
    headers = [token_header(viewer)]

    async def body():
        communicator, _, _ = await connect("/ws/runs/", headers)
        await communicator.receive_json_from(timeout=5)  # the snapshot
        # The runs are made once the socket follows the stream, and their changes are taken
        # as they are pushed: none of them is still on its way when the resumes begin, to
        # be taken for a replay.
        await database_sync_to_async(lambda: [queued_run() for _ in range(3)])()
        live = [await communicator.receive_json_from(timeout=5) for _ in range(3)]
        first = live[0]["seq"]
        assert [m["seq"] for m in live] == [first, first + 1, first + 2]
        for _ in range(100):  # a flood: each would replay the events again
            await communicator.send_json_to({"type": "resume", "after": first})
        flood = [await communicator.receive_json_from(timeout=5)]
        while flood[-1]["seq"] != first + 2:
            flood.append(await communicator.receive_json_from(timeout=5))
        await communicator.send_json_to({"type": "resume", "after": first - 1})  # earlier
        # Only the earlier resume's replay holds ``first``: what comes before it is the
        # flood's, a second replay of it still on its way.
        earlier = [await communicator.receive_json_from(timeout=5)]
        while earlier[0]["seq"] != first:
            flood.append(earlier.pop())
            earlier.append(await communicator.receive_json_from(timeout=5))
        while earlier[-1]["seq"] != first + 2:
            earlier.append(await communicator.receive_json_from(timeout=5))
        assert await communicator.receive_nothing(timeout=0.5)
        # The flood's first replay (perhaps one more, if the flood took longer than
        # RESUME_COALESCE_SECONDS), then the earlier one's: where each resume alone would
        # have replayed the events a hundred times.
        assert len(flood) <= 6 and [m["seq"] for m in earlier] == [first, first + 1, first + 2]
        await communicator.disconnect()

    run_async(body)
