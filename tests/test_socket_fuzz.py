"""A websocket fuzzer: random and malformed frames, as a viewer and as an operator.

Text and binary frames, huge ones, deeply nested JSON, invalid UTF-8 and lone surrogates,
commands with every wrong type and shape. Whatever comes, no consumer crashes, each frame is
answered with exactly one ``invalid`` error, and the socket stays usable: a resume still
replays what it should. The seed is printed with the count; ``SOCKET_FUZZ_SEED`` repeats a
run, ``SOCKET_FUZZ_FRAMES`` sets the frames per role.
"""

import json
import os
import random
import string

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from awaken_site.asgi import application
from runs import domain as services
from runs.models import Event
from tests.conftest import api_key_for, make_user
from tests.factories import queued_run

pytestmark = pytest.mark.django_db(transaction=True)

FRAMES = int(os.getenv("SOCKET_FUZZ_FRAMES", "400"))
SEED = int(os.getenv("SOCKET_FUZZ_SEED", str(random.SystemRandom().randrange(2**32))))
KEYS = ["type", "kind", "seq", "run", "id", "", "é", "\u0000", "resume", "TYPE"]
WRONG_AFTERS = ["-1", "1.5", "1e400", "-1e400", "NaN", "Infinity", "-Infinity", '"3"', "null",
                "true", "false", "[]", "{}", "[1]", str(2**63), str(-(2**70)), "0.0", "1E2",
                '"\\ud800"', "-0.5"]


@pytest.fixture(autouse=True)
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def json_value(rng: random.Random, depth: int = 0):
    """A random JSON value; an object never has both "type": "resume" and "after"."""
    kind = rng.randrange(7 if depth < 4 else 4)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, -1, 7, 2**40, -(2**63), 1.5, -0.0, 1e300])
    if kind == 2:
        alphabet = string.printable + "é€😀\u2028"
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
    if kind == 3:
        return rng.choice(["resume", "snapshot", "run.changed", "error", ""])
    if kind == 4:
        return [json_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(KEYS): json_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def bad_frame(rng: random.Random) -> tuple[str, dict]:
    """One frame that is not a well-formed command: its kind, and ``send_to``'s arguments."""
    kind = rng.choice(["text", "json", "wrong-after", "wrong-shape", "nested", "huge",
                       "binary", "surrogate", "trailing"])
    if kind == "text":
        size = rng.randrange(1, 300)
        text = "".join(rng.choice(string.printable + "{}[]\":,é\u0000") for _ in range(size))
        return kind, {"text_data": text if text.strip() else "?"}
    if kind == "json":
        return kind, {"text_data": json.dumps(json_value(rng))}
    if kind == "wrong-after":
        return kind, {"text_data": f'{{"type": "resume", "after": {rng.choice(WRONG_AFTERS)}}}'}
    if kind == "wrong-shape":
        shapes = [{"type": "resume"}, {"after": 1}, {"type": "resume", "after": 1, "x": 1},
                  {"type": "Resume", "after": 1}, {"type": ["resume"], "after": 1},
                  {"type": None, "after": 1}, {"type": rng.choice(KEYS[1:8]), "after": 1}]
        return kind, {"text_data": json.dumps(rng.choice(shapes))}
    if kind == "nested":
        depth = rng.choice([1_000, 10_000, 100_000])
        opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
        return kind, {"text_data": opener * depth + "1" + closer * depth}
    if kind == "huge":
        size = rng.randrange(1_000_000, 3_000_000)
        padding = "x" * size
        return kind, {"text_data": rng.choice([
            padding, f'{{"type": "resume", "after": 0, "pad": "{padding}"}}'])}
    if kind == "binary":
        payload = rng.choice([rng.randbytes(rng.randrange(1, 200)), b"\xff\xfe\xfd",
                              b'{"type": "resume", "after": 0}', b"\xc3\x28" * 10])
        return kind, {"bytes_data": payload}
    if kind == "surrogate":
        return kind, {"text_data": rng.choice(['{"type": "resume", "after": 0, "\ud800": 1}',
                                               "\udcff", '{"type": "\ud83d"}'])}
    return kind, {"text_data": '{"type": "resume", "after": 0}' + rng.choice([" x", "}", ","])}


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
def test_random_and_malformed_frames_never_break_a_socket(role, capsys):
    rng = random.Random(f"{SEED}-{role}")
    run = queued_run()
    services.run_cancel(run_id=run.id, actor="fuzz", source="api")
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
            answer = await communicator.receive_json_from(timeout=5)
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
