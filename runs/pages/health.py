"""Broker reachability and worker count, for /healthz."""

from celery import current_app as app


def broker_and_workers(timeout: float = 0.5) -> tuple[str, int]:
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout)
    except Exception:
        return "down", 0
    try:
        replies = app.control.ping(timeout=timeout) or []
    except Exception:
        replies = []
    return "ok", len(replies)
