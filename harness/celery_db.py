"""The lifecycle benchmark's baseline: what a Django team gets today for "tasks with their
state in the database" from Celery alone.

A plain Celery app, configured the way its documentation suggests for that: the state of
each task tracked (``task_track_started``: PENDING -> STARTED -> SUCCESS) in Celery's
SQLAlchemy database result backend, in tables of its own (``celery_taskmeta``) on the
project's PostgreSQL, with the project's broker. It knows nothing of Django or of the
project's models. ``manage.py bench lifecycle`` starts a prefork worker of it
(``celery -A harness.celery_db worker``) and has callers wait on ``trivial.delay()``.

SQLAlchemy is a development dependency only (the ``dev`` extras): nothing in the product
imports this module.
"""

import os

from celery import Celery


def trivial(number: int) -> int:
    """The task: it does nothing, so that what is measured is the machinery."""
    return number + 1


def make_app(broker: str, backend: str, queue: str = "celery") -> Celery:
    """The baseline's Celery app on ``broker`` with results in ``backend``, sending to and
    consuming ``queue``; its one task is ``app.tasks["baseline.trivial"]``."""
    app = Celery("awaken_baseline", broker=broker, backend=backend, set_as_current=False)
    app.conf.update(
        task_track_started=True,
        task_default_queue=queue,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    app.task(name="baseline.trivial")(trivial)
    return app


# The worker's app (``celery -A harness.celery_db worker``), configured by the benchmark
# through the environment.
app = make_app(os.environ.get("AWAKEN_BASELINE_BROKER", "memory://"),
               os.environ.get("AWAKEN_BASELINE_BACKEND", "cache+memory://"),
               os.environ.get("AWAKEN_BASELINE_QUEUE", "celery"))


def backend_url(database_url: str) -> str:
    """Celery's result backend URL for a ``postgres://`` database URL: SQLAlchemy's
    ``postgresql+psycopg`` dialect (psycopg 3, the driver the project uses)."""
    scheme, rest = database_url.split("://", 1)
    if scheme not in ("postgres", "postgresql"):
        raise ValueError(f"not a PostgreSQL URL: {scheme}://...")
    return f"db+postgresql+psycopg://{rest}"
