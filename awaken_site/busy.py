"""An exhausted database pool is a 503 ``busy`` with ``Retry-After``, never a 500.

A view that waits ``DB_POOL_TIMEOUT`` for a connection and gets none raises psycopg_pool's
``PoolTimeout``, which Django wraps in its ``OperationalError`` (the original as its cause).
This middleware answers that one error as the API's JSON error, on every route; any other
database error stays the 500 it is.
"""

from django.db import OperationalError
from django.http import JsonResponse

RETRY_AFTER = 1  # seconds


def pool_exhausted(exc: BaseException) -> bool:
    """Whether ``exc`` is a wait for a pooled connection that ran out of time."""
    try:
        from psycopg_pool import PoolTimeout
    except ImportError:  # no pool without psycopg_pool (SQLite)
        return False
    return isinstance(exc, OperationalError) and isinstance(exc.__cause__, PoolTimeout)


def busy_response() -> JsonResponse:
    response = JsonResponse({"code": "busy", "detail": "The database is busy: no connection "
                             "was free in time. Try again shortly."}, status=503)
    response["Retry-After"] = str(RETRY_AFTER)
    return response


class PoolExhaustedIsBusy:
    """Django middleware: a view that got no database connection answers 503 ``busy``."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        return busy_response() if pool_exhausted(exception) else None
