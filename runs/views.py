"""HTML pages and the health check."""

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from runs import selectors


@login_required
@require_GET
def index(request):
    page, _ = selectors.run_list(filters={}, limit=50)
    return render(request, "runs/index.html", {"runs": page})


@require_GET
def healthz(request):
    """Database reachable (else 503), broker reachable, and how many workers answer a ping."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        return JsonResponse({"db": "down", "broker": "unknown", "workers": 0}, status=503)
    from runs import health

    broker, workers = health.broker_and_workers()
    return JsonResponse({"db": "ok", "broker": broker, "workers": workers})
