"""Sockets on a real daphne process (PostgreSQL, which it shares with the test): clients that
stop reading cost a bounded buffer and are disconnected, a client that reads late gets every
push whole and in order, and a logout or a deactivation in another process closes a user's
open sockets within 5 s."""

import json
import struct
import threading
import time

import pytest
from django.conf import settings
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from harness.hostile import StalledClient, rss_bytes
from harness.processes import Web, wait_until
from tests.conftest import api_key_for, browser_for, make_user
from tests.factories import queued_run

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def web(django_db_setup, django_db_blocker):
    """One daphne for the module, on the test database."""
    with django_db_blocker.unblock():
        process = Web().wait_ready()
    with process:
        yield process


def test_clients_that_stop_reading_are_disconnected_and_cost_a_bounded_buffer(web):
    """Each stalled client asks for replays of some 800 KB, 20 times over: 16 MB each that
    daphne would otherwise hold for it."""
    viewer = make_user("slow", "viewer")
    token = api_key_for(viewer)
    for _ in range(40):
        queued_run(input={"blob": "x" * 20_000})

    with ws_connect(f"ws://127.0.0.1:{web.port}/ws/runs/",
                    additional_headers={"Authorization": f"Token {token}"}) as reader:
        reader.recv(timeout=10)  # the snapshot
        reader.send(json.dumps({"type": "resume", "after": 0}))
        for _ in range(40):  # warm: the replay's code paths, pools and buffers
            reader.recv(timeout=10)
    before = rss_bytes(web.pid)

    clients = [StalledClient(web.port, token) for _ in range(10)]
    peak = before
    try:
        for asked in range(20):
            for client in clients:
                # Each from further back than the last, so none is coalesced with it.
                client.send_text(json.dumps({"type": "resume", "after": 19 - asked}))

        def all_dropped():
            nonlocal peak
            peak = max(peak, rss_bytes(web.pid))
            return all(client.dropped() for client in clients)

        wait_until(all_dropped, 40, "the server to drop every stalled client", every=0.1)
    finally:
        for client in clients:
            client.close()
    grown = peak - before
    # Ten clients each hold at most the socket's buffer, the connection's 64 KiB and a
    # message, besides what the replays allocate while they are read.
    limit = 10 * (settings.AWAKEN_SOCKET_BUFFER_BYTES + MiB) + 20 * MiB
    print(f"\ndaphne: {before / MiB:.0f} MiB before, peak {peak / MiB:.0f} MiB "
          f"(+{grown / MiB:.1f}), {rss_bytes(web.pid) / MiB:.0f} MiB after")
    assert grown < limit, f"daphne grew by {grown / MiB:.0f} MiB"

    # The server goes on serving.
    with ws_connect(f"ws://127.0.0.1:{web.port}/ws/runs/",
                    additional_headers={"Authorization": f"Token {token}"}) as reader:
        assert json.loads(reader.recv(timeout=10))["type"] == "snapshot"


def received(sock, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    return data


def next_message(sock) -> dict:
    """The next text message the server sent on a raw socket (pings are skipped)."""
    while True:
        head, length = received(sock, 2)
        length &= 0x7F
        if length == 126:
            length = struct.unpack("!H", received(sock, 2))[0]
        elif length == 127:
            length = struct.unpack("!Q", received(sock, 8))[0]
        payload = received(sock, length)
        if head & 0x0F in (0x9, 0xA):
            continue
        assert head == 0x81, f"not one whole text frame: {head:#x}"
        return json.loads(payload)


def test_a_slow_client_gets_every_push_whole_and_in_order(web):
    """A burst of large changes to a client that reads slowly (a small receive buffer, read
    as it comes): parts are written at once, the rest waits in the connection's buffer and
    the socket's outbox while the client drains it; each push arrives once, whole, in commit
    order."""
    viewer = make_user("slow-reader", "viewer")
    client = StalledClient(web.port, api_key_for(viewer))
    made, pushed, failed = [], [], []

    def read():
        try:
            while len(pushed) < 20:
                message = next_message(client.sock)
                if message["type"] == "run.changed":
                    pushed.append(message)
        except Exception as error:  # the test's thread reports it
            failed.append(error)

    try:
        assert next_message(client.sock)["type"] == "snapshot"  # the socket follows
        reader = threading.Thread(target=read)
        reader.start()
        made = [str(queued_run(input={"blob": "x" * 30_000}).id) for _ in range(20)]
        reader.join(60)
    finally:
        client.close()
    assert not failed, failed
    assert [message["run"]["id"] for message in pushed] == made
    assert all(len(message["run"]["input"]["blob"]) == 30_000 for message in pushed)
    seqs = [message["seq"] for message in pushed]
    assert seqs == sorted(seqs)


@pytest.mark.parametrize("how", ["logout", "deactivated"])
def test_a_logout_or_deactivation_elsewhere_closes_the_socket_within_5s(web, how):
    viewer = make_user("leaving", "viewer")
    browser = browser_for(viewer)
    origin = f"http://127.0.0.1:{web.port}"
    with ws_connect(f"ws://127.0.0.1:{web.port}/ws/runs/", origin=origin, additional_headers={
            "Cookie": f"sessionid={browser.cookies['sessionid'].value}"}) as socket_:
        assert json.loads(socket_.recv(timeout=10))["type"] == "snapshot"
        if how == "logout":
            browser.logout()
        else:
            viewer.is_active = False
            viewer.save(update_fields=["is_active"])
        revoked = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            socket_.recv(timeout=10)
        took = time.monotonic() - revoked
    print(f"\nsocket closed {took:.2f} s after the {how}")
    assert closed.value.rcvd.code == 4003
    assert took < 5
