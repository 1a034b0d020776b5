"""Every API error is ``{"code": str, "detail": str}`` with one status per code."""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, JsonResponse
from django.views.defaults import page_not_found
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from runs.domain.errors import Busy, ServiceError


def exception_handler(exc, context):
    if isinstance(exc, ServiceError):
        body = {"code": exc.code, "detail": exc.message}
        if exc.field:
            body["errors"] = {exc.field: [exc.message]}
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, Busy) else None
        return Response(body, status=exc.status, headers=headers)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    if isinstance(exc, RequestDataTooBig):
        return Response(too_large_body(), status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = {"code": "invalid", "detail": _first_message(exc.detail),
                         "errors": exc.detail}
    elif isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        response.data = {"code": codes if isinstance(codes, str) else exc.default_code,
                         "detail": str(exc.detail)}
    return response


def too_large_body() -> dict:
    """The 413 answer to a request body over AWAKEN_MAX_BODY_BYTES."""
    return {"code": "too_large",
            "detail": f"The request body is larger than {settings.AWAKEN_MAX_BODY_BYTES} bytes."}


def _first_message(detail, path="") -> str:
    """A human sentence out of DRF's nested error structure: the first problem, located."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            where = path if key == "non_field_errors" else f"{path}.{key}" if path else str(key)
            return _first_message(value, where)
    if isinstance(detail, list) and detail:
        return _first_message(detail[0], path)
    return f"{path}: {detail}" if path else str(detail)


def not_found(request, exception=None):
    """JSON 404 for unknown URLs under /api/ (Django's HTML page elsewhere)."""
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "not_found", "detail": "Not found."},
                            status=status.HTTP_404_NOT_FOUND)
    return page_not_found(request, exception)
