"""What the framework adapters share: a framework's agent or graph registered under an
awaken name, made once, when first needed, if it was given as a function that makes it."""

from importlib import import_module

from runs.agents import Agent, register


class FrameworkAgent(Agent):
    made = None  # the framework's agent or graph, once made
    make = None  # or the function that makes it
    # What the adapter's runs import: modules, or "module:name" for a name the module
    # loads when first asked for it.
    modules: tuple[str, ...] = ()

    @classmethod
    def prepare(cls) -> None:
        """The framework's modules, imported, and its agent or graph, made: off the
        worker's loop (``Agent.prepare``), as either takes up to a second or more."""
        for entry in cls.modules:
            module, _, name = entry.partition(":")
            loaded = import_module(module)
            if name:
                getattr(loaded, name)
        cls.framework_object()

    @classmethod
    def framework_object(cls):
        if cls.made is None:
            cls.made = cls.make()
        return cls.made


def wrapped(base: type, thing, *, name: str, ready, prefix: str, description: str = "",
            example: dict | None = None, **hooks) -> type:
    """Register a subclass of ``base`` as the agent ``name``: ``thing`` is the framework's
    object if ``ready(thing)``, else what makes it; each hook given (not None) replaces the
    base's static method of that name; ``description`` and ``example`` are the agent's
    (``runs.agents.Agent``). Returns the registered class."""
    made = ready(thing)
    attributes = {"__module__": base.__module__, "name": name, "description": description,
                  "example": example,
                  "made": thing if made else None, "make": None if made else staticmethod(thing),
                  **{key: staticmethod(hook) for key, hook in hooks.items() if hook is not None}}
    return register(type(f"{prefix}_{name.replace('.', '_')}", (base,), attributes))
