"""HTML pages: the operator page, a run's page, their live partials, and the health check."""

from django.contrib.auth.decorators import login_required
from django.core.exceptions import BadRequest, PermissionDenied
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from runs.domain import bulk, catalogue, selectors
from runs.domain.errors import InvalidRequest, RunNotFound
from runs.domain.roles import is_operator, is_viewer
from runs.pages import filters, health
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


def page_of_runs(request, chosen: filters.ListFilter):
    try:
        return selectors.run_list(filters=chosen.matching(), search=chosen.q, sort=chosen.sort,
                                  cursor=request.GET.get("cursor") or None, limit=50)
    except InvalidRequest:
        raise Http404("This page of the list does not exist (the link is stale or was "
                      "edited).") from None


MAX_DEPTH = 4  # the rows' indentation steps (site.css)


def nested(runs: list) -> list:
    """The page's runs with each child right under its parent when both are on the page
    (in the page's order otherwise), marked with ``depth`` and ``child_count``."""
    on_page = {run.id for run in runs}
    children: dict = {}
    for run in runs:
        if run.parent_id in on_page:
            children.setdefault(run.parent_id, []).append(run)
    ordered = []

    def place(run, depth):
        run.depth = min(depth, MAX_DEPTH)
        run.child_count = len(children.get(run.id, ()))
        ordered.append(run)
        for child in children.get(run.id, ()):
            place(child, depth + 1)

    for run in runs:
        if run.parent_id not in on_page:
            place(run, 0)
    return ordered


def page_context(request, **extra) -> dict:
    return {"can_control": is_operator(request.user), "agents": catalogue.names(),
            **extra}


def sort_links(chosen: filters.ListFilter) -> dict:
    """Per sortable column: the query string that sorts by it (descending first, then the
    other way on a second click) and the ``aria-sort`` it has now."""
    links = {}
    for name in filters.SORTABLE:
        current = chosen.sort.removeprefix("-") == name
        descending = chosen.sort.startswith("-")
        next_sort = name if current and descending else f"-{name}"
        links[name] = {"query": chosen.query(sort=next_sort),
                       "aria": ("descending" if descending else "ascending") if current
                       else "none"}
    return links


@viewer_required
@require_GET
def index(request):
    chosen = filters.read(request.GET)
    runs, cursor = page_of_runs(request, chosen)
    return render(request, "runs/index.html", page_context(
        request, runs=nested(runs), cursor=cursor, filter=chosen, statuses=filters.STATUSES,
        sorts=sort_links(chosen), query=chosen.query(), api_filter=chosen.api()))


MAX_ASKED = 100  # runs a live list may ask about at once


@viewer_required
@require_GET
def rows(request):
    """More rows of the list (``Load more``), rendered by the same partial; or, with
    ``ids``, those of the named runs that match the list's filter: how a filtered live list
    learns whether a pushed run belongs in it (the filter applies here, not in the page)."""
    chosen = filters.read(request.GET)
    if "ids" in request.GET:
        try:
            ids = [selectors.parse_run_id(part) for part in request.GET["ids"].split(",")
                   if part][:MAX_ASKED]
        except RunNotFound:
            raise BadRequest("ids are run ids, comma-separated.") from None
        found = selectors.runs_among(ids=ids, filters=chosen.matching(), search=chosen.q)
        for run in found:
            run.depth, run.child_count = 0, 0
        return render(request, "runs/_rows.html", page_context(request, runs=found,
                                                               cursor=None))
    runs, cursor = page_of_runs(request, chosen)
    return render(request, "runs/_rows.html", page_context(
        request, runs=nested(runs), cursor=cursor, query=chosen.query()))


@viewer_required
@require_GET
def overview(request):
    """The overview's charts; the figures come from /api/overview/, polled by the page."""
    return render(request, "runs/overview.html", page_context(request))


@viewer_required
@require_GET
def bulk_jobs(request):
    """Past and running bulk jobs, newest first, kept live by the run list's socket."""
    try:
        jobs, cursor = bulk.bulk_jobs(cursor=request.GET.get("cursor") or None, limit=50)
    except InvalidRequest:
        raise Http404("This page of bulk jobs does not exist (the link is stale or was "
                      "edited).") from None
    return render(request, "runs/bulk.html", page_context(request, jobs=jobs, cursor=cursor))


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
def favicon(request):
    """Browsers ask for /favicon.ico on their own: the site's icon is a static SVG."""
    return redirect(static("runs/favicon.svg"), permanent=True)


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
