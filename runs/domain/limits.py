"""What JSON from outside must be before any of it is stored: the same on every database.

PostgreSQL's ``jsonb`` refuses NUL characters, lone surrogates and non-finite numbers when
the row is written; SQLite stores some of them and then fails when the row is read back or
rendered. Values are therefore checked here, before anything is written, and refused
alike on both.
"""

import json
import math

from runs.domain.errors import InvalidRequest

# The deepest nesting of arrays and objects a stored value (or a request body) may have.
MAX_DEPTH = 64


def check_json(value, field: str = "") -> None:
    """Refuse ``value`` (a decoded JSON value, found at ``field``, or a whole request body
    when ``field`` is empty) if it is nested deeper than ``MAX_DEPTH``, holds a non-finite
    number, or holds text (a key or a string) with a NUL character or a lone surrogate.
    The error names where, e.g. ``input.items.3``. Walks the value without recursion, so
    any depth is safe to check."""
    pending = [(value, 1, ())]
    while pending:
        item, depth, path = pending.pop()
        if isinstance(item, str):
            _check_text(item, field, path)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise _refused(field, path, "holds a number that is not finite "
                                            "(JSON has no NaN or infinity)")
        elif isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise _refused(field, path, f"is nested deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str):
                        _check_text(key, field, path, what="a key")
                    pending.append((child, depth + 1, (*path, key)))
            else:
                pending.extend((child, depth + 1, (*path, index))
                               for index, child in enumerate(item))


def check_text(text: str, field: str) -> None:
    """Refuse text that no database stores alike: a NUL character or a lone surrogate."""
    _check_text(text, field, ())


def _check_text(text: str, field: str, path: tuple, what: str = "") -> None:
    where = f" in {what}" if what else ""
    if "\x00" in text:
        raise _refused(field, path, f"holds the NUL character (\\u0000){where}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _refused(field, path, f"holds a lone surrogate (a \\ud800-\\udfff "
                                        f"escape without its pair){where}") from None


def _refused(field: str, path: tuple, problem: str) -> InvalidRequest:
    """The error for ``problem`` at ``path`` under ``field`` (its first steps). Only keys
    already checked are named, so the message itself is always valid text."""
    steps = [*([field] if field else []), *(str(step)[:40] for step in path[:6])]
    if len(path) > 6:
        steps.append("…")
    where = ".".join(steps)
    if not where:
        return InvalidRequest(f"The body {problem}.")
    return InvalidRequest(f"{where} {problem}.", field=where)


def encoded_size(value) -> int:
    """The bytes of ``value`` as compact UTF-8 JSON."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def check_size(value, field: str, limit: int) -> None:
    """Refuse ``value`` if it encodes to more than ``limit`` bytes."""
    if encoded_size(value) > limit:
        raise InvalidRequest(f"{field} is larger than {limit} bytes encoded.", field=field)
