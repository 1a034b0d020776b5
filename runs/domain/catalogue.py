"""The catalogue of agents a run may name.

The domain only needs the names (a run of an unknown agent is refused); the worker runtime
looks the classes up here to run them. Agents register themselves with ``register`` when
their module is imported, which the project wiring does at start-up.
"""

CATALOGUE: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: add an agent class (it has a ``name``) to the catalogue."""
    if not getattr(cls, "name", ""):
        raise ValueError(f"{cls.__name__} needs a name")
    CATALOGUE[cls.name] = cls
    return cls


def names() -> list[str]:
    return sorted(CATALOGUE)
