"""A websocket fuzzer: random and malformed frames, as a viewer and as an operator.

Text and binary frames, huge ones, deeply nested JSON, invalid UTF-8 and lone surrogates,
commands with every wrong type and shape. Whatever comes, no consumer crashes, each frame is
answered with exactly one ``invalid`` error, and the socket stays usable: a resume still
replays what it should. The seed is printed with the count; ``SOCKET_FUZZ_SEED`` repeats a
run, ``SOCKET_FUZZ_FRAMES`` sets the frames per role.
"""

import os
import random

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from awaken_site.asgi import application
from harness.hostile_input import bad_frame
from runs import domain
from runs.models import Event
from tests.conftest import api_key_for, make_user
from tests.factories import queued_run

pytestmark = pytest.mark.django_db(transaction=True)

FRAMES = int(os.getenv("SOCKET_FUZZ_FRAMES", "400"))
SEED = int(os.getenv("SOCKET_FUZZ_SEED", str(random.SystemRandom().randrange(2**32))))


async def answer_to(communicator, last_seq: int) -> dict:
    """The next message that is not the push of a change committed before the socket
    connected: the stream may push it after the snapshot that already holds it."""
    while True:
        message = await communicator.receive_json_from(timeout=5)
        if message.get("type") != "run.changed" or message["seq"] > last_seq:
            return message


async def resume_works(communicator, last_seq: int) -> None:
    """A resume after 0 replays every event up to ``last_seq``, in order."""
    await communicator.send_json_to({"type": "resume", "after": 0})
    seqs = []
    while not seqs or seqs[-1] != last_seq:
        message = await communicator.receive_json_from(timeout=5)
        assert message["type"] == "run.changed", message
        seqs.append(message["seq"])
    assert seqs == sorted(seqs)


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_random_and_malformed_frames_never_break_a_socket(role, capsys, monkeypatch):
    # Each resume here must replay, however soon after the last one (the coalescing of
    # resumes has its own tests, in tests/test_consumers.py).
    monkeypatch.setattr("runs.sockets.consumers.RESUME_COALESCE_SECONDS", 0)
    rng = random.Random(f"{SEED}-{role}")
    run = queued_run()
    domain.run_cancel(run_id=run.id, actor="fuzz", source="api")
    last_seq = Event.objects.latest("seq").seq
    user = make_user(f"fuzz-{role}", role)
    headers = [(b"authorization", f"Token {api_key_for(user)}".encode())]
    kinds: dict[str, int] = {}

    async def body():
        communicator = WebsocketCommunicator(application, "/ws/runs/", headers=headers)
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        assert (await communicator.receive_json_from(timeout=5))["type"] == "snapshot"
        for number in range(1, FRAMES + 1):
            kind, frame = bad_frame(rng)
            kinds[kind] = kinds.get(kind, 0) + 1
            await communicator.send_to(**frame)
            answer = await answer_to(communicator, last_seq)
            assert answer["type"] == "error" and answer["code"] == "invalid", (kind, frame)
            if number % 100 == 0:
                await resume_works(communicator, last_seq)
        await resume_works(communicator, last_seq)
        assert await communicator.receive_nothing(timeout=0.1)
        assert not communicator.future.done()  # the consumer still runs: it never crashed
        await communicator.disconnect()

    async_to_sync(body)()
    with capsys.disabled():
        print(f"\nwebsocket fuzzer ({role}, seed {SEED}): {FRAMES} bad frames, "
              f"{sum(kinds.values())} errors, 0 crashes; by kind: {dict(sorted(kinds.items()))}")
