"""The catalogue of agents a run may name.

The domain only needs the names (a run of an unknown agent is refused); the worker runtime
looks the classes up here to run them. Agents register themselves with ``register`` when
their module is imported, which the project wiring does at start-up (``runs.apps``).
"""

CATALOGUE: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: add an agent class (it has a ``name``) to the catalogue.

    A name belongs to one class: another class of the same name is refused, so two packages
    cannot silently take each other's agent (importing a module again is harmless).
    """
    if not getattr(cls, "name", ""):
        raise ValueError(f"{cls.__name__} needs a name")
    known = CATALOGUE.get(cls.name)
    if known is not None and _where(known) != _where(cls):
        raise ValueError(f"Two agents are named {cls.name!r}: {_where(known)} and "
                         f"{_where(cls)}.")
    CATALOGUE[cls.name] = cls
    return cls


def names() -> list[str]:
    return sorted(CATALOGUE)


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
