"""The interface for agent authors: import what an agent needs from here.

    from runs.agents import Agent, register, tool

An agent is an async ``run(ctx)`` that returns the run's output; ``ctx`` is its ``Context``
(model calls, tools, steps, the live inbox, pauses, approvals: ``ctx.approval`` returns a
``Decision``). ``register`` adds an agent class to the
catalogue when its module is imported. The adapters for agents written with a framework
live next to this module, one per framework (``runs.agents.pydantic_ai``,
``runs.agents.openai_agents``, ``runs.agents.langgraph``), each imported only by the
agents that use it. ``runs.runtime`` is the worker's inside and may change; this module is
the stable path.

The agents that ship with awaken-site (``runs.agents.demo`` and the adapters' shipped
agents) are imported only when ``demo_agents_enabled()``: a demo agent that hangs or fans
out is a tool for a test, not something a production deployment should let anyone start.
"""

from django.conf import settings

from runs.runtime.agent import (
    Agent,
    BudgetExceeded,
    Context,
    Decision,
    Interrupted,
    Paused,
    ProviderError,
    Reply,
    Tool,
    register,
    tool,
)

__all__ = ["Agent", "BudgetExceeded", "Context", "Decision", "Interrupted", "Paused",
           "ProviderError", "Reply", "Tool", "demo_agents_enabled", "register", "tool"]


def demo_agents_enabled() -> bool:
    """Whether the shipped demo agents are registered: ``AWAKEN_DEMO_AGENTS=1``, which
    ``make run``, the harness and the tests set; production processes leave it unset."""
    return settings.AWAKEN_DEMO_AGENTS
