"""The project wiring of the ``runs`` app: what Django runs once every model is loaded.

It plugs the adapters into the domain's two outside interfaces (``runs.domain.outside``),
has each new PostgreSQL connection read ``timestamptz`` with the driver's compiled loader
(``awaken_site.django_postgresql``) and loads the agents into the catalogue, in every
process alike (web, worker, beat, commands, tests): the built-in demo agents (with
``AWAKEN_DEMO_AGENTS=1`` only), the modules of ``AWAKEN_AGENTS``, then the
``awaken.agents`` entry points of the installed packages.
"""

from importlib import import_module
from importlib.metadata import entry_points

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.backends.signals import connection_created

from awaken_site import django_postgresql

ENTRY_POINT_GROUP = "awaken.agents"


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Run control"

    def ready(self):
        # Imported here, not at the top: these modules use the models, which Django loads
        # only after this module.
        from runs.agents import demo_agents_enabled, frameworks
        from runs.changes import publishing
        from runs.domain import outside, prices
        from runs.workers import dispatch

        outside.connect(workers=dispatch, changes=publishing)
        connection_created.connect(django_postgresql.load_times_with_the_driver)
        prices.parse_prices(settings.AWAKEN_MODEL_PRICES)  # a bad table stops the start-up
        if demo_agents_enabled():
            import_module("runs.agents.demo")  # registers the demo agents
            frameworks.register_installed()  # the shipped agents of the installed frameworks
        load_agents(settings.AWAKEN_AGENTS)
        checks.register(ended_when_idle_in_transaction, checks.Tags.database)


def load_agents(modules, group: str = ENTRY_POINT_GROUP) -> None:
    """Import the agents of ``modules`` (names, or one comma-separated string), then those
    of every entry point of ``group``. An entry point names a module, whose agents register
    themselves when imported (``module``), or one agent class (``module:Class``), registered
    here. Anything that cannot be loaded stops the start-up with the reason."""
    from runs.domain.catalogue import register

    if isinstance(modules, str):
        modules = [name.strip() for name in modules.split(",") if name.strip()]
    for name in modules:
        try:
            import_module(name)
        except Exception as error:
            raise ImproperlyConfigured(f"AWAKEN_AGENTS names {name!r}, which cannot be "
                                       f"imported: {type(error).__name__}: {error}") from error
    for point in entry_points(group=group):
        try:
            loaded = point.load()
            if isinstance(loaded, type):
                register(loaded)
        except Exception as error:
            raise ImproperlyConfigured(f"The {group} entry point {point.name!r} "
                                       f"({point.value}) cannot be loaded: "
                                       f"{type(error).__name__}: {error}") from error


def ended_when_idle_in_transaction(databases=None, **kwargs) -> list:
    """Behind a transaction pooler (``DB_POOLER=transaction``) the site cannot give its
    sessions ``idle_in_transaction_session_timeout`` (``DB_IDLE_IN_TRANSACTION_SECONDS``):
    warn when the server does not end a session idle inside a transaction, whose row locks
    a frozen process would otherwise hold for ever. A database check: ``migrate`` runs it,
    and ``check --database default``."""
    if settings.DB_POOLER != "transaction" or "default" not in (databases or ()):
        return []
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT current_setting('idle_in_transaction_session_timeout'), "
                       "quote_ident(current_user)")
        timeout, role = cursor.fetchone()
    if timeout != "0":
        return []
    seconds = settings.DB_IDLE_IN_TRANSACTION_SECONDS
    return [checks.Warning(
        "Behind a transaction pooler the site cannot set idle_in_transaction_session_timeout, "
        "and the server leaves it off: a process frozen inside a transaction would hold its "
        "row locks for ever.",
        hint=f"ALTER ROLE {role} SET idle_in_transaction_session_timeout = "
             f"'{seconds:g}s'; or set the pooler's own limit (PgBouncer's "
             "idle_transaction_timeout) and silence awaken.W001.",
        id="awaken.W001")]
