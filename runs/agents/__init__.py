"""The catalogue of agents a run may name: every registered ``runs.runtime.agent.Agent``."""

from runs.agents import demo  # noqa: F401  (registers the demo agents)
from runs.runtime.agent import CATALOGUE

__all__ = ["CATALOGUE"]
