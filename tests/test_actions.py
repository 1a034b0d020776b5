import hashlib

import pytest

from runs.domain.actions import action_digest, canonical_json

# No test here uses the test database: its verdict is the same on either backend.
pytestmark = pytest.mark.one_backend


def test_the_digest_is_the_sha256_of_the_canonical_json_of_tool_and_arguments():
    expected = hashlib.sha256(
        '{"arguments":{"body":"hé","to":"a@b.c"},"tool":"send_email"}'.encode()).hexdigest()
    assert action_digest("send_email", {"to": "a@b.c", "body": "hé"}) == expected


def test_the_digest_ignores_key_order_and_tells_arguments_apart():
    assert (action_digest("t", {"a": 1, "b": [1, {"y": 2, "x": 1}]})
            == action_digest("t", {"b": [1, {"x": 1, "y": 2}], "a": 1}))
    assert action_digest("t", {"a": 1}) != action_digest("t", {"a": 2})
    assert action_digest("t", {"a": 1}) != action_digest("u", {"a": 1})


def test_a_value_json_cannot_carry_is_refused():
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})
