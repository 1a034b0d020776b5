"""Agents that ship with awaken-site. Each module registers its agents in the catalogue
(``runs.domain.catalogue``) when it is imported; the project wiring imports them.

The demo agents (``demo``, and any other shipped agent meant for trying the site out) are
imported only when ``demo_agents_enabled()``: a demo agent that hangs or fans out is a tool
for a test, not something a production deployment should let anyone start.
"""

from django.conf import settings


def demo_agents_enabled() -> bool:
    """Whether the shipped demo agents are registered: ``AWAKEN_DEMO_AGENTS=1``, which
    ``make run``, the harness and the tests set; production processes leave it unset."""
    return settings.AWAKEN_DEMO_AGENTS
