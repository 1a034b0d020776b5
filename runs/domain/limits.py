"""What JSON from outside must be before any of it is stored: the same on every database,
and the one rule for a run's budget.

PostgreSQL's ``jsonb`` refuses NUL characters, lone surrogates and non-finite numbers when
the row is written; SQLite stores some of them and then fails when the row is read back or
rendered. Values are therefore checked here, before anything is written, and refused
alike on both.
"""

import json
import math
import re
from dataclasses import dataclass

from runs.domain.errors import InvalidRequest
from runs.domain.text import ELLIPSIS, clipped

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
    steps = [*([field] if field else []), *(clipped(str(step), 40) for step in path[:6])]
    if len(path) > 6:
        steps.append(ELLIPSIS)
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


# --- Budgets: the one rule for every way a run is made (API, batch, run again, child runs,
# the page's form) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """One budget a run may have: a number greater than 0 (API.md gives each as a count or
    a number of seconds, and a budget of 0 or less could stop nothing a run does), whole
    for ``integral`` ones, and at most ``maximum``: the largest value its column holds."""

    key: str
    integral: bool
    maximum: float

    @property
    def words(self) -> str:
        """The budget's name as people read it: "max steps"."""
        return self.key.replace("_", " ")

    @property
    def smallest(self) -> int | None:
        """The smallest value allowed, when there is one (a whole budget's 1); a number of
        seconds may be as small as it likes above 0."""
        return 1 if self.integral else None


BUDGETS = (
    Budget("max_steps", integral=True, maximum=2**31 - 1),
    Budget("max_seconds", integral=False, maximum=315_360_000.0),  # ten years
    Budget("max_tokens", integral=True, maximum=2**63 - 1),
    Budget("max_cost_usd", integral=False, maximum=1e9),  # US dollars
    Budget("max_repeats", integral=True, maximum=2**31 - 1),  # the loop guard
)
BUDGET_KEYS = tuple(budget.key for budget in BUDGETS)
BUDGET_BY_KEY = {budget.key: budget for budget in BUDGETS}
# What reaching a budget does (``on_exhausted``): stored beside the budgets, not one of them.
ON_EXHAUSTED = "on_exhausted"
ON_EXHAUSTED_CHOICES = ("stop", "pause")
# The stop code (and loop-guard ticket) of each budget.
STOP_CODES = {"max_steps": "max_steps", "max_seconds": "max_seconds",
              "max_tokens": "max_tokens", "max_cost_usd": "max_cost",
              "max_repeats": "max_repeats"}


def check_budget(budget) -> dict:
    """``budget`` (a JSON object, or None for none) as stored: the budgets it sets, each
    checked against ``BUDGETS``, and ``on_exhausted`` if given; a key that is not a budget
    is refused."""
    if budget is None:
        return {}
    if not isinstance(budget, dict):
        raise InvalidRequest("budget must be a JSON object.", field="budget")
    unknown = set(budget) - {*BUDGET_KEYS, ON_EXHAUSTED}
    if unknown:
        raise InvalidRequest(f"Unknown budget keys: {', '.join(sorted(map(str, unknown)))}.",
                             field="budget")
    clean = {}
    policy = budget.get(ON_EXHAUSTED)
    if policy is not None:
        if policy not in ON_EXHAUSTED_CHOICES:
            raise InvalidRequest(f"budget.{ON_EXHAUSTED} must be one of "
                                 f"{', '.join(ON_EXHAUSTED_CHOICES)}.", field="budget")
        clean[ON_EXHAUSTED] = policy
    for rule in BUDGETS:
        value = budget.get(rule.key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                rule.integral and not isinstance(value, int)):
            kind = "a whole number" if rule.integral else "a number"
            raise InvalidRequest(f"budget.{rule.key} must be {kind}.", field="budget")
        if not value > 0:  # NaN too
            raise InvalidRequest(f"budget.{rule.key} must be greater than 0.", field="budget")
        if value > rule.maximum:
            raise InvalidRequest(f"budget.{rule.key} must be at most {rule.maximum:g}.",
                                 field="budget")
        clean[rule.key] = value
    return clean


def check_raised(current: dict, raised) -> dict:
    """The budgets of ``raised`` (a resume's ``budget``, checked by ``check_budget``) that
    are higher than ``current`` (the run's budgets, None for unset): the limits a resume
    raises. A budget given no higher than it is, or a new ``on_exhausted``, is refused;
    so is a resume that raises nothing. A budget the run did not have may be set."""
    clean = check_budget(raised)
    if ON_EXHAUSTED in clean:
        raise InvalidRequest(f"A resume raises limits; budget.{ON_EXHAUSTED} stays as the "
                             "run was made.", field="budget")
    for key, value in clean.items():
        if current.get(key) is not None and not value > current[key]:
            raise InvalidRequest(f"budget.{key} must be raised above {current[key]:g} "
                                 f"(it is {current[key]:g}).", field="budget")
    if not clean:
        raise InvalidRequest("Give the budget to raise: budget.max_steps, max_seconds, "
                             "max_tokens, max_cost_usd or max_repeats.", field="budget")
    return clean


def budget_schema() -> dict:
    """``BUDGETS`` as the OpenAPI 3.0 schema of a request's ``budget`` object."""
    return {
        "type": "object", "additionalProperties": False,
        "properties": {
            **{rule.key: {"type": "integer" if rule.integral else "number",
                          "nullable": True, "minimum": 0, "exclusiveMinimum": True,
                          "maximum": rule.maximum} for rule in BUDGETS},
            ON_EXHAUSTED: {"type": "string", "enum": list(ON_EXHAUSTED_CHOICES),
                           "nullable": True,
                           "description": "Reaching a budget stops the run (default) or "
                                          "pauses it with a ticket of reason budget."}},
    }


# A number in a query string: plain ASCII digits, and for seconds a decimal point. Python's
# int() and float() take far more ("²" is a digit to str.isdigit, "١٢" and " 1_0 " are
# numbers to int(), "nan" and "1e9" to float()): each is refused, never converted.
PLAIN_INTEGER = re.compile(r"[0-9]{1,20}")
PLAIN_DECIMAL = re.compile(r"[0-9]{1,20}(\.[0-9]{1,9})?")


def plain_integer(text: str) -> int | None:
    """``text`` as an int if it is plain ASCII digits, else None."""
    return int(text) if PLAIN_INTEGER.fullmatch(text) else None
