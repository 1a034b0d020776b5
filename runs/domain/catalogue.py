"""The catalogue of agents a run may name.

The domain only needs the names (a run of an unknown agent is refused); the worker runtime
looks the classes up here to run them. Agents register themselves with ``register`` when
their module is imported, which the project wiring does at start-up (``runs.apps``).
Each agent says what it does and gives an input it runs with (its ``description`` and
``example``): the new-run form shows them (``described``).
"""

import inspect
import json

CATALOGUE: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: add an agent class (it has a ``name``) to the catalogue.

    A name belongs to one class: another class of the same name is refused, so two packages
    cannot silently take each other's agent (importing a module again is harmless). An
    ``example`` is a JSON object, or none.
    """
    if not getattr(cls, "name", ""):
        raise ValueError(f"{cls.__name__} needs a name")
    example = getattr(cls, "example", None)
    if example is not None:
        if not isinstance(example, dict):
            raise ValueError(f"{cls.name}'s example must be a dict (an input), not a "
                             f"{type(example).__name__}")
        try:
            json.dumps(example)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{cls.name}'s example is not JSON: {error}") from None
    known = CATALOGUE.get(cls.name)
    if known is not None and _where(known) != _where(cls):
        raise ValueError(f"Two agents are named {cls.name!r}: {_where(known)} and "
                         f"{_where(cls)}.")
    CATALOGUE[cls.name] = cls
    return cls


def names() -> list[str]:
    return sorted(CATALOGUE)


def described() -> list[dict]:
    """Each agent, by name: its ``name``, ``description`` (its own, else the first
    paragraph of its class's own docstring, else "") and ``example`` (an input, or None)."""
    return [{"name": name, "description": description(CATALOGUE[name]),
             "example": getattr(CATALOGUE[name], "example", None)} for name in names()]


def description(cls: type) -> str:
    said = getattr(cls, "description", "") or ""
    if not said:
        doc = cls.__dict__.get("__doc__")  # its own: not the adapter's or Agent's
        said = inspect.cleandoc(doc).split("\n\n")[0] if doc else ""
    return " ".join(said.replace("``", "").split())


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
