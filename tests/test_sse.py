"""Server-sent events on the embedded site (daphne, the in-process worker): the socket's
messages as ``text/event-stream``, replay from ``Last-Event-ID`` or ``?after=`` without gaps
or duplicates, REST's authentication, and a stream that ends when its token is revoked."""

import json
import time

import httpx
import pytest

from runs.sockets.events import frame


def events(response, *, deadline: float = 20):
    """The events of an open ``text/event-stream`` response, as (name, id, data, comments
    seen before it)."""
    name = seq = None
    data, comments = [], []
    end = time.monotonic() + deadline
    for line in response.iter_lines():
        assert time.monotonic() < end, "the stream did not send what was awaited in time"
        if line.startswith(":"):
            comments.append(line)
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("id: "):
            seq = int(line[4:])
        elif line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and data:
            yield name, seq, json.loads("\n".join(data)), comments
            name = seq = None
            data, comments = [], []


def open_stream(site, path="/api/runs/stream/", token=None, headers=None, **options):
    client = httpx.Client(base_url=site.base, timeout=httpx.Timeout(20, read=20))
    auth = {"Authorization": f"Token {token or site.token}"} if token is not False else {}
    return client, client.stream("GET", path, headers={**auth, **(headers or {})}, **options)


def create(site, **input):
    status, run = site.call("POST", "/api/runs/", {"agent": "demo.steps", "input": input})
    assert status == 201, run
    return run


def test_a_frame_is_named_by_the_message_type_and_numbered_by_its_seq():
    text = json.dumps({"type": "run.changed", "seq": 42, "event": {}, "run": {}})
    assert frame(text) == f"event: run.changed\nid: 42\ndata: {text}\n\n"
    assert frame('{"type": "bulk.changed", "job": {}}').startswith("event: bulk.changed\ndata:")


def test_the_stream_of_one_run_sends_its_snapshot_then_each_change_then_resumes(embedded_site):
    run = create(embedded_site, steps=3, step_seconds=0.4)
    client, stream = open_stream(embedded_site, f"/api/runs/{run['id']}/stream/")
    seen = []
    with client, stream as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        received = events(response)
        name, seq, snapshot, _ = next(received)
        assert name == "snapshot" and seq == snapshot["seq"]
        assert [r["id"] for r in snapshot["runs"]] == [run["id"]]
        version = snapshot["runs"][0]["version"]
        assert snapshot["runs"][0]["state"] != "ended"
        for name, seq, message, _ in received:
            if name == "run.activity":  # the run's live activity, as its socket gets it
                continue
            assert name == "run.changed" and seq == message["seq"]
            assert message["run"]["id"] == run["id"]
            seen.append((seq, message["event"]["kind"]))
            if message["run"]["state"] == "ended":
                break
    kinds = [kind for _, kind in seen]
    assert kinds[-1] == "ended" and kinds.count("step") >= 3 - (version - 1)
    assert [s for s, _ in seen] == sorted({s for s, _ in seen})  # in order, no duplicates

    # Reconnecting after the second change replays the ones after it.
    middle = seen[1][0]
    for headers, path in (({"Last-Event-ID": str(middle)}, f"/api/runs/{run['id']}/stream/"),
                          ({}, f"/api/runs/{run['id']}/stream/?after={middle}")):
        client, stream = open_stream(embedded_site, path, headers=headers)
        with client, stream as response:
            replayed = []
            for name, seq, message, _ in events(response):
                if name != "run.changed":
                    continue
                replayed.append(seq)
                if message["event"]["kind"] == "ended":
                    break
        # Every change after the cursor, once and in order; before them, the replay may repeat
        # changes from a short window before the cursor (what a later commit with an earlier
        # seq would be found in), which readers skip by their seq.
        assert [s for s in replayed if s > middle] == [s for s, _ in seen if s > middle]
        assert replayed == sorted(set(replayed))


def test_the_stream_of_every_run_goes_on_live(embedded_site):
    client, stream = open_stream(embedded_site)
    with client, stream as response:
        received = events(response)
        name, _, snapshot, _ = next(received)
        assert name == "snapshot"
        run = create(embedded_site, steps=1, step_seconds=0.01)
        for name, seq, message, _ in received:
            if name == "run.changed" and message["run"]["id"] == run["id"]:
                assert seq > snapshot["seq"]
                if message["run"]["state"] == "ended":
                    break


@pytest.mark.parametrize("token, headers, path, status, code", [
    (False, {}, "/api/runs/stream/", 401, "not_authenticated"),
    ("not-a-key", {}, "/api/runs/stream/", 401, "authentication_failed"),
    (None, {"Last-Event-ID": "x1"}, "/api/runs/stream/", 400, "invalid"),
    (None, {}, "/api/runs/stream/?after=-1", 400, "invalid"),
    (None, {}, "/api/runs/not-a-uuid/stream/", 404, "not_found"),
    (None, {}, "/api/runs/00000000-0000-0000-0000-000000000000/stream/", 404, "not_found"),
])
def test_a_refused_stream_is_a_json_error(embedded_site, token, headers, path, status, code):
    client, stream = open_stream(embedded_site, path, token=token, headers=headers)
    with client, stream as response:
        response.read()
    assert (response.status_code, response.json()["code"]) == (status, code)


def test_a_post_is_not_allowed_and_other_paths_still_reach_django(embedded_site):
    with httpx.Client(base_url=embedded_site.base, timeout=10) as client:
        auth = {"Authorization": f"Token {embedded_site.token}"}
        answer = client.post("/api/runs/stream/", headers=auth)
        assert (answer.status_code, answer.json()["code"]) == (405, "method_not_allowed")
        assert client.get("/api/runs/", headers=auth).status_code == 200


def test_a_stream_ends_when_its_token_is_revoked(embedded_site):
    key = embedded_site.manage("operator_token", "sse-viewer", "--role", "viewer",
                               "--create").strip()
    client, stream = open_stream(embedded_site, token=key)
    with client, stream as response:
        received = events(response, deadline=15)
        assert next(received)[0] == "snapshot"
        embedded_site.manage("operator_token", "sse-viewer")  # a new key replaces it
        started = time.monotonic()
        for _ in received:  # ends once the recheck finds the key gone
            pass
    assert time.monotonic() - started < 10


def test_a_stream_opens_on_a_connection_that_served_django_before(embedded_site):
    # Kept alive, the connection's next request starts where Django's response left it.
    auth = {"Authorization": f"Token {embedded_site.token}"}
    with httpx.Client(base_url=embedded_site.base, timeout=20) as client:
        for _ in range(3):
            assert client.get("/api/runs/", headers=auth).status_code == 200
            with client.stream("GET", "/api/runs/stream/", headers=auth) as response:
                assert response.status_code == 200
                assert next(events(response))[0] == "snapshot"


def test_a_replay_larger_than_the_outbox_is_sent_whole(embedded_site):
    # Twenty runs of some 60 KB each: a replay of 1.2 MB, more than a stream may hold
    # waiting (AWAKEN_SOCKET_BUFFER_BYTES, 1 MiB); it goes out as the connection takes it.
    client, stream = open_stream(embedded_site)
    with client, stream as response:
        after = next(events(response))[2]["seq"]
    later = "2999-01-01T00:00:00+00:00"
    ids = {embedded_site.call("POST", "/api/runs/", {
        "agent": "demo.steps", "input": {"blob": "x" * 60_000}, "start_after": later})[1]["id"]
        for _ in range(20)}
    client, stream = open_stream(embedded_site, f"/api/runs/stream/?after={after}")
    with client, stream as response:
        seen = set()
        for name, _, message, _ in events(response):
            if name == "run.changed" and message["run"]["id"] in ids:
                seen.add(message["run"]["id"])
                if seen == ids:
                    break
    assert seen == ids


def test_a_reader_that_does_not_read_is_ended_after_a_bounded_buffer(embedded_site):
    import socket

    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.connect(("127.0.0.1", embedded_site.port))
    reader.sendall(f"GET /api/runs/stream/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   f"Authorization: Token {embedded_site.token}\r\n\r\n".encode())
    later = "2999-01-01T00:00:00+00:00"
    try:
        # Some 9 MB of changes pushed to a reader that reads none of it.
        for _ in range(150):
            status, _ = embedded_site.call("POST", "/api/runs/", {
                "agent": "demo.steps", "input": {"blob": "x" * 60_000}, "start_after": later})
            assert status == 201
        # Reading now, it finds the response ended (the last, empty chunk) well before the
        # 9 MB: what it did not read was dropped, not kept for it.
        reader.settimeout(30)
        received, tail, end = 0, b"", time.monotonic() + 60
        while time.monotonic() < end:
            chunk = reader.recv(1 << 16)
            if not chunk:
                break
            received += len(chunk)
            tail = (tail + chunk)[-16:]
            if tail.endswith(b"\r\n0\r\n\r\n"):
                break
        else:
            pytest.fail("the stream of a reader that does not read was never ended")
    finally:
        reader.close()
    assert tail.endswith(b"\r\n0\r\n\r\n") or not chunk
    assert received < 6_000_000, received
