"""The one parser of request bodies: strict JSON, checked before any view sees it.

Python's ``json`` takes ``1e400`` as infinity, a lone ``\\ud800`` as a string and the
last of two equal keys, and recurses once per level of nesting (a deep enough body is a
``RecursionError``). Here each of these is a 400 ``invalid``, and malformed JSON a 400
``parse_error``, whatever the body is for.
"""

import json

from rest_framework import parsers
from rest_framework.exceptions import ParseError

from runs.domain import limits
from runs.domain.errors import InvalidRequest
from runs.domain.text import clipped


class _Refused(Exception):
    """Raised from inside the decoder; turned into an InvalidRequest by ``parse``."""


def _finite(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise _Refused(f"The number {clipped(text, 40)} is out of range (JSON has no infinity).")
    return number


def _no_constant(name: str):
    raise _Refused(f"{name} is not a JSON number.")


def _unique_keys(pairs: list) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"The key {clipped(key, 40)!r} is given twice in one object.")
            seen.add(key)
    return value


class JSONParser(parsers.JSONParser):
    """Strict JSON, UTF-8 only (RFC 8259), checked by ``runs.domain.limits.check_json``."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            text = stream.read().decode("utf-8")
        except UnicodeDecodeError as error:
            raise ParseError(f"JSON parse error - the body is not UTF-8 ({error.reason}).") \
                from None
        try:
            data = json.loads(text, parse_float=_finite, parse_constant=_no_constant,
                              object_pairs_hook=_unique_keys)
        except _Refused as error:
            raise InvalidRequest(str(error)) from None
        except RecursionError:
            raise InvalidRequest(
                f"The body is nested deeper than {limits.MAX_DEPTH} levels.") from None
        except ValueError as error:
            raise ParseError(f"JSON parse error - {error}") from None
        limits.check_json(data)
        return data
