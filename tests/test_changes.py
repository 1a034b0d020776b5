"""The change stream of one process (runs/changes/): one subscription, kept alive past the
channel layer's group expiry, feeding sockets that cannot hold each other up."""

import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
import time
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from awaken_site.settings import channel_prefix, redis_channel_layer
from harness.processes import ROOT
from runs.changes.outbox import Outbox
from runs.changes.stream import stream

versions = itertools.count(1)


@pytest.fixture
def layer(settings):
    """An in-memory layer that forgets a group member after about a second."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer",
                                           "CONFIG": {"group_expiry": 1}}}


def change(run_id: str) -> dict:
    run = {"id": run_id, "version": next(versions), "state": "running"}
    return {"type": "run.changed", "run_id": run_id,
            "text": json.dumps({"type": "run.changed", "run": run})}


def test_membership_is_renewed_before_the_layer_expires_it(layer):
    run_id = str(uuid.uuid4())
    renewals = stream.renewals
    with stream.watch(run_id) as watch:
        assert watch.live
        started = time.monotonic()
        pushes = 0
        while time.monotonic() - started < 4:  # several expiry periods
            message = change(run_id)
            stream.publish([message])
            pushed = watch.next(timeout=2)
            assert pushed is not None, f"push lost after {time.monotonic() - started:.1f} s"
            assert pushed["version"] == json.loads(message["text"])["run"]["version"]
            pushes += 1
    assert pushes > 4
    assert stream.renewals - renewals >= 4  # renewed every quarter of the expiry


def test_one_stalled_socket_holds_up_no_other(layer):
    async def body():
        stalled = asyncio.Event()
        fast, slow = [], []

        async def send_fast(text):
            fast.append(text)

        async def send_slow(text):
            slow.append(text)
            await stalled.wait()  # a client that never reads

        async def nothing():
            pass

        quick, stuck = Outbox(send_fast, nothing), Outbox(send_slow, nothing)
        run_id = str(uuid.uuid4())
        await stream.join(stuck, run_id)
        await stream.join(quick)
        try:
            texts = []
            for _ in range(3):
                message = change(run_id)
                texts.append(message["text"])
                stream.publish([message])
            deadline = time.monotonic() + 5
            while len(fast) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert fast == texts
            assert slow == texts[:1]  # still stuck in its first send
        finally:
            for outbox, follows in ((quick, None), (stuck, run_id)):
                stream.leave(outbox, follows)
                outbox.close()

    async_to_sync(body)()


def test_changes_published_together_go_as_few_group_messages_and_arrive_in_order(
        layer, monkeypatch):
    """The messages pending at a send go as one ``batch`` group message, up to
    ``BATCH_MESSAGES`` of them and ``BATCH_BYTES`` of their texts; a larger one alone.
    Each follower gets every one, in the order published."""
    from channels.layers import InMemoryChannelLayer
    sent = []
    group_send = InMemoryChannelLayer.group_send

    async def counted(self, group, message):
        sent.append(message)
        await group_send(self, group, message)
    monkeypatch.setattr(InMemoryChannelLayer, "group_send", counted)
    run_id = str(uuid.uuid4())
    messages = [change(str(uuid.uuid4())) for _ in range(230)]
    messages[7] = change(run_id)
    large = change(run_id)
    large["text"] = json.dumps({"type": "run.changed", "pad": "x" * (300 * 1024)})
    messages[120] = large
    messages.append({"type": "run.output", "run_id": run_id, "text": "output"})

    async def body():
        got, theirs = [], []

        async def into(box):
            async def send(text):
                box.append(text)
            return send

        async def nothing():
            pass

        every, one = Outbox(await into(got), nothing), Outbox(await into(theirs), nothing)
        await stream.join(every)
        await stream.join(one, run_id)
        try:
            stream.publish(messages)
            deadline = time.monotonic() + 10
            while len(got) < 230 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert got == [m["text"] for m in messages if m["type"] == "run.changed"]
            while len(theirs) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert theirs == [messages[7]["text"], large["text"], "output"]
        finally:
            for outbox, follows in ((every, None), (one, run_id)):
                stream.leave(outbox, follows)
                outbox.close()

    async_to_sync(body)()
    ours = [m for m in sent if m.get("type") != "ping"]
    # Every message once, in order, in sends within both bounds.
    assert [each for m in ours for each in (m["messages"] if m["type"] == "batch" else [m])
            ] == messages
    for m in ours:
        if m["type"] == "batch":
            assert 1 < len(m["messages"]) <= stream.BATCH_MESSAGES
            assert sum(len(each["text"]) for each in m["messages"]) <= stream.BATCH_BYTES
    assert large in ours  # alone
    assert len(ours) <= 6


def test_a_web_process_sends_the_changes_of_a_burst_together_and_a_lone_one_at_once(
        layer, monkeypatch):
    """With a linger (a web process's ``AWAKEN_PUBLISH_LINGER``), a change after a quiet
    spell is sent at once; the changes published within the linger of that send wait for
    its end and go together, one group message."""
    from channels.layers import InMemoryChannelLayer
    sent = []
    group_send = InMemoryChannelLayer.group_send

    async def timed(self, group, message):
        if message.get("type") != "ping":
            sent.append((time.monotonic(), message))
        await group_send(self, group, message)
    monkeypatch.setattr(InMemoryChannelLayer, "group_send", timed)
    monkeypatch.setattr(stream, "linger", 1.0)
    monkeypatch.setattr(stream, "_last_send", float("-inf"))  # quiet until now
    alone, *burst = [change(str(uuid.uuid4())) for _ in range(3)]

    def wait_for(count):
        deadline = time.monotonic() + 10
        while len(sent) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(sent) == count, sent

    published = time.monotonic()
    stream.publish([alone])
    wait_for(1)
    for message in burst:  # within the linger of the send just made
        stream.publish([message])
    wait_for(2)
    (first_at, first), (second_at, second) = sent
    assert first == alone
    assert first_at - published < stream.linger  # not held: nothing was sent before it
    assert second == {"type": "batch", "messages": burst}
    assert second_at - first_at >= stream.linger


def test_a_socket_too_far_behind_is_closed_once():
    async def body():
        overflowed = []
        never = asyncio.Event()

        async def send(text):
            await never.wait()

        async def overflow():
            overflowed.append(True)

        outbox = Outbox(send, overflow, limit=3)
        for n in range(10):
            outbox.put(f"message {n}")
        await asyncio.sleep(0)  # let the overflow task run
        assert overflowed == [True]
        assert outbox.closed

    async_to_sync(body)()


def test_a_socket_whose_connection_takes_nothing_holds_a_bounded_queue():
    """While the connection is full, messages wait in the outbox, counted in bytes: one
    more than it may hold closes the socket."""
    async def body():
        sent, overflowed = [], []
        connection_free = asyncio.Event()

        async def send(text):
            sent.append(text)

        async def overflow():
            overflowed.append(True)

        outbox = Outbox(send, overflow, max_bytes=1000, writable=connection_free.wait)
        for n in range(3):
            outbox.put(f"{n}" * 300)
        await asyncio.sleep(0)
        assert sent == [] and not outbox.closed  # 900 bytes wait for the connection
        connection_free.set()
        deadline = time.monotonic() + 5
        while len(sent) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert sent == [f"{n}" * 300 for n in range(3)]

        connection_free.clear()
        for n in range(3):
            outbox.put(f"{n}" * 300)
        assert not outbox.closed
        outbox.put("x" * 101)  # 1001 bytes waiting
        await asyncio.sleep(0)
        assert outbox.closed and overflowed == [True]

    async_to_sync(body)()


def test_a_held_outbox_sends_what_it_is_released_with_first():
    async def body():
        sent = []

        async def send(text):
            sent.append(text)

        async def nothing():
            pass

        outbox = Outbox(send, nothing, held=True)
        outbox.put("push 1")
        outbox.put("push 2")
        await asyncio.sleep(0.01)
        assert sent == []
        outbox.release("snapshot")
        deadline = time.monotonic() + 5
        while len(sent) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert sent == ["snapshot", "push 1", "push 2"]
        outbox.close()

    async_to_sync(body)()


def test_an_idle_outbox_writes_at_once_and_a_busy_one_keeps_the_order():
    """``write_now`` is tried only when nothing waits or is being sent: a message never
    overtakes one queued before it."""
    async def body():
        written, sent = [], []
        takes = {"now": True}

        def write_now(text):
            if takes["now"]:
                written.append(text)
            return takes["now"]

        async def send(text):
            sent.append(text)

        async def nothing():
            pass

        outbox = Outbox(send, nothing, write_now=write_now, held=True)
        outbox.put("before release")
        assert written == []  # a held outbox writes nothing
        outbox.release("snapshot")
        outbox.put("1")
        assert written == []  # behind the snapshot and what was put meanwhile
        deadline = time.monotonic() + 5
        while len(sent) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert sent == ["snapshot", "before release", "1"]

        outbox.put("2")
        assert written == ["2"]  # idle: written in the call, by no task
        takes["now"] = False
        outbox.put("3")  # the connection does not take it now: queued
        takes["now"] = True
        outbox.put("4")  # behind "3", so queued too
        assert written == ["2"]
        deadline = time.monotonic() + 5
        while len(sent) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert sent == ["snapshot", "before release", "1", "3", "4"]
        outbox.put("5")
        assert written == ["2", "5"]
        outbox.close()
        outbox.put("6")
        assert written == ["2", "5"]

    async_to_sync(body)()


def test_the_channel_prefix_is_derived_from_the_database_name(monkeypatch):
    monkeypatch.delenv("AWAKEN_CHANNEL_PREFIX", raising=False)
    names = ["awaken", "awaken_staging", "/srv/a/" + "d" * 80 + "/awaken.sqlite3",
             "/srv/b/" + "d" * 80 + "/awaken.sqlite3"]
    prefixes = [channel_prefix({"NAME": name}) for name in names]
    assert len(set(prefixes)) == len(names)
    assert prefixes[0] == "awaken.awaken."
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]{1,60}", prefix) for prefix in prefixes)
    assert channel_prefix({"NAME": "awaken"}) == prefixes[0]  # every process agrees

    monkeypatch.setenv("AWAKEN_CHANNEL_PREFIX", "blue.")
    assert channel_prefix({"NAME": "awaken"}) == "blue."
    monkeypatch.setenv("AWAKEN_CHANNEL_PREFIX", "blue green")
    with pytest.raises(ImproperlyConfigured):
        channel_prefix({"NAME": "awaken"})


def test_the_redis_layer_is_prefixed():
    config = redis_channel_layer("redis://127.0.0.1:6379/3", "awaken.blue.")
    assert config["CONFIG"]["prefix"] == "awaken.blue."
    if settings.REDIS_URL:
        prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
        assert prefix == settings.AWAKEN_CHANNEL_PREFIX


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis (REDIS_URL)")
def test_deployments_that_share_a_redis_server_never_hear_each_other():
    """Two deployments on one Redis server, as settings configure them: a message of one
    never reaches the other. (Their database numbers would not keep them apart: Redis
    pub/sub ignores them.)"""

    def layer(database_name: str):
        config = redis_channel_layer(settings.REDIS_URL,
                                     channel_prefix({"NAME": database_name}))
        return RedisPubSubChannelLayer(**config["CONFIG"])

    async def body():
        blue, green = layer("awaken_blue"), layer("awaken_green")
        try:
            listening = {}
            for name, deployment in (("blue", blue), ("green", green)):
                channel = await deployment.new_channel()
                await deployment.group_add("runs", channel)
                listening[name] = channel
                # A round trip: the subscription is in place before anyone publishes.
                await deployment.group_send("runs", {"type": "ping"})
                assert await asyncio.wait_for(deployment.receive(channel), 5) == {
                    "type": "ping"}
            await blue.group_send("runs", {"type": "run.changed", "text": "blue's run"})
            await green.group_send("runs", {"type": "run.changed", "text": "green's run"})
            # Each hears its own message first: the other's, published before it, would
            # have come first on the same server.
            for name, deployment in (("green", green), ("blue", blue)):
                heard = await asyncio.wait_for(deployment.receive(listening[name]), 5)
                assert heard["text"] == f"{name}'s run"
        finally:
            await blue.flush()
            await green.flush()

    async_to_sync(body)()


WEB_PROCESS_FIRST_USE = """
import json, os, sys, threading
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
import awaken_site.asgi  # as a web process starts
from runs.changes.stream import stream
imported = []
sys.addaudithook(lambda event, args: imported.append(args[0])
                 if event == "import" and threading.current_thread().name != "changes"
                 else None)
subscribed = stream.listening(10)  # what a socket's join asks, on the server's loop
stream.publish([{"type": "ping"}])  # what a change's commit asks, in its request
print(json.dumps({"subscribed": subscribed, "imported": imported}))
"""


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis (REDIS_URL)")
def test_a_web_process_makes_its_channel_layer_before_it_serves():
    """The first socket's join and the first change's publish in a web process import
    nothing: not on the loop every connection shares, not in a request."""
    program = subprocess.run([sys.executable, "-c", WEB_PROCESS_FIRST_USE], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert program.returncode == 0, program.stderr[-3000:]
    result = json.loads(program.stdout.strip().splitlines()[-1])
    assert result == {"subscribed": True, "imported": []}


def test_a_web_process_takes_its_linger_from_the_setting():
    program = subprocess.run(
        [sys.executable, "-c", "import awaken_site.asgi\n"
         "from runs.changes.stream import stream\nprint(stream.linger)"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "awaken_site.settings",
             "AWAKEN_PUBLISH_LINGER": "0.25"})
    assert program.returncode == 0, program.stderr[-3000:]
    assert program.stdout.strip().splitlines()[-1] == "0.25"


@pytest.mark.django_db(transaction=True)
def test_a_wait_that_began_before_the_stream_subscribed_reads_the_run_once_it_has():
    """A change committed while the stream was not subscribed yet is never pushed: the
    wait reads the run once subscribed instead of waiting for a push that cannot come."""
    from runs import domain
    from runs.api import waiting
    from tests.factories import running_run

    run, _ = running_run()
    result = domain.run_cancel(run_id=run.pk, actor="olga", source="api")
    domain.attempt_interrupted(run_id=run.pk, generation=result.run.generation)  # unseen
    with waiting.watching(run.pk) as watch:
        watch.live = False  # as if the stream subscribed only after the request committed
        started = time.monotonic()
        answer = waiting.wait_for_end(result.run, 30, watch)
    assert answer["state"] == "ended" and answer["end_cause"] == "cancelled"
    assert time.monotonic() - started < 15, "it waited for a push that could not come"
