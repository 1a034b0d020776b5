"""Whether a worker is warm: the remote-control command ``awaken_prepared``.

Registered where the Celery app is made (``awaken_site.celery``), so that the command line
knows it as the worker does: ``celery -A awaken_site inspect awaken_prepared`` asks every
worker (``-d NODE`` one), a readiness check for a deployment. The module is imported before
Django is set up, so the executor is looked up only when asked.
"""

from celery.worker.control import inspect_command


@inspect_command()
def awaken_prepared(state):
    """Whether this worker has prepared every agent of the catalogue as it started, and
    frozen what that made (``runs.runtime.executor``): warm, its runs wait for no
    framework's import; and how many seconds that took from the executor's start.
    (A prefork pool's parent runs no attempt: never.)"""
    from runs.runtime.executor import current_executor  # asked: Django is set up by now

    executor = current_executor()
    seconds = None if executor is None else executor.prepared_in
    return {"prepared": seconds is not None, "seconds": seconds}
