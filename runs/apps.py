"""The project wiring of the ``runs`` app: what Django runs once every model is loaded.

It plugs the adapters into the domain's ports (``runs.domain.ports``) and loads the agents
into the catalogue, in every process alike (web, worker, beat, commands, tests).
"""

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Run control"

    def ready(self):
        # Imported here, not at the top: these modules use the models, which Django loads
        # only after this module.
        from runs import changes
        from runs.agents import demo  # noqa: F401  (registers the demo agents)
        from runs.domain import ports
        from runs.wire import web_side

        ports.connect(workers=web_side, changes=changes)
