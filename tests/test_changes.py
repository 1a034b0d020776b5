"""The change stream of one process (runs/changes.py): one subscription, kept alive past the
channel layer's group expiry, feeding sockets that cannot hold each other up."""

import asyncio
import itertools
import json
import time
import uuid

import pytest
from asgiref.sync import async_to_sync

from runs.changes import Outbox, stream

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
