"""HTML pages: the operator page, a run's page, their live partials, and the health check."""

from django.contrib.auth.decorators import login_required
from django.core.exceptions import BadRequest, PermissionDenied
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from runs.domain import catalogue, selectors
from runs.domain.errors import InvalidRequest, RunNotFound
from runs.domain.roles import is_operator, is_viewer
from runs.models import EndCause, RunState
from runs.pages import health
from runs.pages import metrics as stop_metrics


def viewer_required(view):
    @login_required
    def wrapped(request, *args, **kwargs):
        if not is_viewer(request.user):
            raise PermissionDenied("You need the viewer or operator role.")
        return view(request, *args, **kwargs)

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return wrapped


def list_filters(request) -> dict:
    """The page's filters: state (or end cause), agent, and a search by id or thread."""
    filters = {}
    status = request.GET.get("status", "")
    if status in RunState.values:
        filters["state"] = status
    elif status in EndCause.values:
        filters["end_cause"] = status
    if request.GET.get("by_agent") in catalogue.CATALOGUE:
        filters["agent"] = request.GET["by_agent"]
    return filters


def page_of_runs(request):
    search = request.GET.get("q", "")
    if "\x00" in search:  # no id or thread id holds one, and PostgreSQL cannot take it
        raise BadRequest("The search holds a NUL character.")
    try:
        return selectors.run_list(filters=list_filters(request), search=search,
                                  cursor=request.GET.get("cursor") or None, limit=50)
    except InvalidRequest:
        raise Http404("No such page.") from None


def page_context(request, **extra) -> dict:
    return {"can_control": is_operator(request.user), "agents": catalogue.names(),
            **extra}


@viewer_required
@require_GET
def index(request):
    runs, cursor = page_of_runs(request)
    return render(request, "runs/index.html", page_context(
        request, runs=runs, cursor=cursor,
        statuses=[*(s for s in RunState.values if s != RunState.ENDED), *EndCause.values],
        status=request.GET.get("status", ""), agent=request.GET.get("by_agent", ""),
        q=request.GET.get("q", "")))


@viewer_required
@require_GET
def rows(request):
    """More rows of the list (``Load more``), rendered by the same partial."""
    runs, cursor = page_of_runs(request)
    return render(request, "runs/_rows.html", page_context(request, runs=runs, cursor=cursor))


@viewer_required
@require_GET
def detail(request, run_id):
    return render(request, "runs/detail.html", page_context(request, **run_panel(run_id)))


@viewer_required
@require_GET
def panel(request, run_id):
    """The live part of a run's page, re-rendered when the run or a descendant changes."""
    return render(request, "runs/_panel.html", page_context(request, **run_panel(run_id)))


def run_panel(run_id) -> dict:
    try:
        return selectors.run_page(run_id=run_id)
    except RunNotFound:
        raise Http404("No such run.") from None


@require_GET
def metrics(request):
    """Prometheus exposition, for scrapers (no user needed, like /healthz)."""
    stop_metrics.register()
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


@require_GET
def healthz(request):
    """Database reachable (else 503), broker reachable, and how many workers answer a ping;
    answered within a second whatever the load (``runs.pages.health``)."""
    now = health.prober.current()
    return JsonResponse(now.as_json(), status=200 if now.db == "ok" else 503)
