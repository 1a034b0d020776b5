"""Hostile input: what the fuzz tests (``tests/test_fuzz.py``, ``tests/test_socket_fuzz.py``)
and the attack of ``manage.py bench hostile`` (``harness/hostile.py``) send. Each function
makes one hostile body or frame from a random source; nothing here sends anything."""

import json
import random
import string

from hypothesis import strategies as st

# --- hostile JSON bodies (also tests/test_fuzz.py) -------------------------------------------

# JSON text that no body may hold, wherever it is put: each is refused by the parser.
HOSTILE_VALUES = {
    "nested-5000-deep": "[" * 5000 + "]" * 5000,
    "nested-65-deep": "[" * 65 + "]" * 65,
    "objects-nested-100-deep": '{"a": ' * 100 + "1" + "}" * 100,
    "1e400": "1e400",
    "-1e999": "-1e999",
    "NaN": "NaN",
    "Infinity": "Infinity",
    "lone-high-surrogate": r'"\ud800"',
    "lone-low-surrogate": r'"tail \udfff"',
    "surrogates-reversed": r'"\udc00\ud800"',
    "surrogate-key": r'{"\udbff": 1}',
    "nul": r'"\u0000"',
    "nul-inside": r'"abc\u0000def"',
    "nul-key": r'{"a\u0000": true}',
}
# Changes to the body's structure: unknown or repeated keys where the API declares its
# fields, and bodies or inputs over the limits.
HOSTILE_SHAPES = ["unknown-key", "key-twice", "body-over-1-mib", "input-over-256-kib"]
# The operations whose bodies carry a run's input.
INPUT_OPERATIONS = {"POST /api/runs/", "POST /api/runs/batch/", "POST /api/runs/{run_id}/resume/"}
SENTINEL = "hostile-value-goes-here"


def places(body, path=()):
    """Every place in ``body`` a value can be put: each existing value, and a new key of
    each object."""
    if isinstance(body, dict):
        yield (*path, SENTINEL)
        for key, value in body.items():
            yield (*path, key)
            yield from places(value, (*path, key))
    elif isinstance(body, list):
        for index, value in enumerate(body):
            yield (*path, index)
            yield from places(value, (*path, index))


def put(body, place, value):
    target = body
    for step in place[:-1]:
        target = target[step]
    target[place[-1]] = value


def declared_objects(body) -> list:
    """The objects of ``body`` whose keys the API declares: the body, a budget, a batch item
    (an input or a message is free-form)."""
    found = [body]
    for item in [body, *(body.get("runs") or [])]:
        if isinstance(item, dict):
            if item is not body:
                found.append(item)
            if isinstance(item.get("budget"), dict):
                found.append(item["budget"])
    return found


def hostile_body(body: dict, kind: str, draw) -> str:
    """The text of ``body`` made hostile by ``kind``."""
    if kind in HOSTILE_VALUES:
        put(body, draw(st.sampled_from(list(places(body)))), SENTINEL)
        return json.dumps(body).replace(json.dumps(SENTINEL), HOSTILE_VALUES[kind], 1)
    if kind == "unknown-key":
        draw(st.sampled_from(declared_objects(body)))["not_a_field"] = 1
    elif kind == "key-twice":
        target = draw(st.sampled_from(declared_objects(body)))
        key = draw(st.sampled_from(sorted(target))) if target else "reason"
        target.setdefault(key, None)
        target[SENTINEL] = None
        return json.dumps(body).replace(json.dumps(SENTINEL), json.dumps(key), 1)
    elif kind == "body-over-1-mib":
        put(body, draw(st.sampled_from(list(places(body)))), "x" * (1024 * 1024))
    elif kind == "input-over-256-kib":
        holders = body.get("runs") if isinstance(body.get("runs"), list) else [body]
        draw(st.sampled_from(holders or [body]))["input"] = {"a": "x" * (256 * 1024)}
    return json.dumps(body)


def hostile_kinds(label: str) -> list[str]:
    """The kinds of hostile body that apply to the operation ``label``."""
    return [kind for kind in [*HOSTILE_VALUES, *HOSTILE_SHAPES]
            if kind != "input-over-256-kib" or label in INPUT_OPERATIONS]


# --- bad socket frames (also tests/test_socket_fuzz.py) --------------------------------------

KEYS = ["type", "kind", "seq", "run", "id", "", "é", "\u0000", "resume", "TYPE"]
WRONG_AFTERS = ["-1", "1.5", "1e400", "-1e400", "NaN", "Infinity", "-Infinity", '"3"', "null",
                "true", "false", "[]", "{}", "[1]", str(2**63), str(-(2**70)), "0.0", "1E2",
                '"\\ud800"', "-0.5"]
# The messages that crashed the socket consumer before it checked what it is sent.
CRASHERS = ["[]", "5", '"x"', "null", '{"type": "resume", "after": 1e400}',
            "[" * 10_000 + "]" * 10_000, '{"a":' * 10_000 + "1" + "}" * 10_000]


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


def bad_frame(rng: random.Random, *, max_huge: int = 3_000_000) -> tuple[str, dict]:
    """One frame that is not a well-formed command: its kind, and ``send_to``'s arguments
    (``text_data`` or ``bytes_data``). A ``huge`` frame is up to ``max_huge`` characters."""
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
        size = rng.randrange(min(1_000_000, max_huge // 3), max_huge)
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
