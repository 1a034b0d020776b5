"""The shipped framework agents (API.md, "Framework agents"): each adapter's module
registers its agents when imported, which is done here for each framework that is
installed (the ``frameworks`` extra). The frameworks themselves are imported only when
one of their runs starts."""

from importlib import import_module
from importlib.util import find_spec

ADAPTERS = {"pydantic_ai": "runs.agents.pydantic_ai",
            "agents": "runs.agents.openai_agents",
            "langgraph": "runs.agents.langgraph"}


def register_installed() -> list[str]:
    """Import the adapter of every installed framework; the modules imported."""
    loaded = []
    for package, module in ADAPTERS.items():
        if find_spec(package) is not None:
            try:
                import_module(module)
            except ModuleNotFoundError as error:
                if error.name != module:
                    raise
                continue  # an adapter not written yet
            loaded.append(module)
    return loaded
