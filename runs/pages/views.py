"""HTML pages: the operator page, a run's page, their live partials, and the health check."""

import json

from django.contrib.auth.decorators import login_required
from django.core.exceptions import BadRequest, PermissionDenied
from django.http import Http404, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.templatetags.static import static
from django.utils import timezone
from django.views.decorators.http import require_GET

from runs.domain import activity, bulk, catalogue, limits, review, selectors, trace
from runs.domain.errors import InvalidRequest, RunNotFound, ServiceError
from runs.domain.roles import is_operator, is_viewer
from runs.models import LIVE_STATES, EndCause, EventKind, Source, TicketReason
from runs.pages import filters, health
from runs.pages import metrics as stop_metrics
from runs.pages.page_rules import page_rules


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


def with_pending(runs: list) -> list:
    """Mark each run with ``pending``: its request not applied yet (``selectors.Pending``),
    or None; the row shows it from server state, so a reload keeps it."""
    found = selectors.pending_requests(runs)
    for run in runs:
        run.pending = found.get(run.id)
    return runs


def page_context(request, **extra) -> dict:
    return {"can_control": is_operator(request.user), "agents": catalogue.names(),
            "ticket_reasons": TicketReason.choices,
            "budgets": limits.BUDGETS, "page_rules": page_rules(), **extra}


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
    return TemplateResponse(request, "runs/index.html", page_context(
        request, runs=with_pending(nested(runs)), cursor=cursor, filter=chosen,
        statuses=filters.STATUSES, sorts=sort_links(chosen), query=chosen.query(),
        api_filter=chosen.api(), **new_run_form()))


FIRST_AGENT = "demo.steps"  # the new-run form's agent when it is there


def new_run_form() -> dict:
    """The new-run form's agents, each with its description and example input (as JSON
    text, ``example_json``; None when it gives none), and the agent chosen first."""
    agents = [{**agent, "example_json": None if agent["example"] is None
               else json.dumps(agent["example"], ensure_ascii=False)}
              for agent in catalogue.described()]
    names = [agent["name"] for agent in agents]
    first = FIRST_AGENT if FIRST_AGENT in names else (names[0] if names else None)
    return {"agent_help": agents, "first_agent": first}


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
        return TemplateResponse(request, "runs/_rows.html", page_context(
            request, runs=with_pending(found), cursor=None))
    runs, cursor = page_of_runs(request, chosen)
    return TemplateResponse(request, "runs/_rows.html", page_context(
        request, runs=with_pending(nested(runs)), cursor=cursor, query=chosen.query()))


@viewer_required
@require_GET
def overview(request):
    """The overview's charts; the figures come from /api/overview/, polled by the page
    over the range of the URL: ``window`` (one of ``RANGES``) or ``since`` and ``until``
    (checked by the API, which the page shows the answer of)."""
    chosen = ("custom" if request.GET.get("since")
              else request.GET.get("window") if request.GET.get("window") in dict(RANGES)
              else "3600")
    return TemplateResponse(request, "runs/overview.html", page_context(
        request, ranges=RANGES, chosen_range=chosen, live_states=LIVE_STATES,
        end_causes=EndCause.values, agent_columns=1 + len(LIVE_STATES) + len(EndCause) + 4))


RANGES = [("900", "last 15 minutes"), ("3600", "last hour"), ("21600", "last 6 hours"),
          ("86400", "last 24 hours"), ("604800", "last 7 days")]


@viewer_required
@require_GET
def workers(request):
    """The worker processes: alive or lost, capacity, live attempts; Drain for operators."""
    return TemplateResponse(request, "runs/workers.html", page_context(
        request, workers=selectors.workers(), now=timezone.now()))


@viewer_required
@require_GET
def bulk_jobs(request):
    """Past and running bulk jobs, newest first, kept live by the run list's socket."""
    try:
        jobs, cursor = bulk.bulk_jobs(cursor=request.GET.get("cursor") or None, limit=50)
    except InvalidRequest:
        raise Http404("This page of bulk jobs does not exist (the link is stale or was "
                      "edited).") from None
    return TemplateResponse(request, "runs/bulk.html",
                            page_context(request, jobs=jobs, cursor=cursor))


@viewer_required
@require_GET
def bulk_job(request, job_id):
    """One bulk job: what it asked of which runs, who started it, from where and when, its
    progress, and a page of the runs it handled with the outcome of each. With ``?items=1``
    only the rows of that page (the page redraws them as the job goes on)."""
    try:
        job = bulk.bulk_job_get(job_id)
    except ServiceError:
        raise Http404("No such bulk job.") from None
    after = limits.plain_integer(request.GET.get("after", "0"))
    if after is None:
        raise BadRequest("after is an item number (ASCII digits).")
    items, next_after = bulk.bulk_job_items(job_id=job.id, after=after)
    context = page_context(request, job=job, items=items, after=after, next_after=next_after,
                           filters=sorted((job.filter or {}).items()))
    if request.GET.get("items") == "1":
        return TemplateResponse(request, "runs/_bulk_items.html", context)
    return TemplateResponse(request, "runs/bulk_job.html", context)


BULK_VIEWS = {"row": "runs/_bulk_row.html", "progress": "runs/_bulk_progress.html"}


@viewer_required
@require_GET
def bulk_rows(request):
    """The named bulk jobs (``ids``, comma-separated) as the jobs page's rows, or with
    ``view=progress`` as the run list's progress box: the pages redraw a pushed job from
    this one rendering."""
    view = BULK_VIEWS.get(request.GET.get("view", "row"))
    if view is None:
        raise BadRequest("view is row or progress.")
    jobs = bulk.bulk_jobs_among(request.GET.get("ids", "").split(",")[:MAX_ASKED])
    return TemplateResponse(request, "runs/_bulk_jobs.html",
                            page_context(request, jobs=jobs, view=view))


@viewer_required
@require_GET
def detail(request, run_id):
    panel = run_panel(run_id)
    entries = activity.run_activity(run_id=panel["run"].id, last=activity.SHOWN)
    # The panel's re-renders leave the activity log out: the page keeps the one it grows.
    return TemplateResponse(request, "runs/detail.html", page_context(
        request, **panel, with_activity=True, entries=entries))


@viewer_required
@require_GET
def panel(request, run_id):
    """The live part of a run's page. Whole, or only some of its parts, which is how the
    page follows the pushes: ``parts`` (comma-separated, of ``selectors.PAGE_PARTS``),
    with ``after`` the timeline's events after that seq only, and ``rows`` (run ids) the
    rows of those runs in its tree of child runs."""
    if not {"parts", "rows", "after"} & request.GET.keys():
        return TemplateResponse(request, "runs/_panel.html",
                                page_context(request, **run_panel(run_id)))
    parts = [part for part in request.GET.get("parts", "").split(",") if part]
    if not set(parts) <= set(selectors.PAGE_PARTS):
        raise BadRequest(f"parts are among {', '.join(selectors.PAGE_PARTS)}.")
    after = None
    if "after" in request.GET:
        after = limits.plain_integer(request.GET["after"])
        if after is None:
            raise BadRequest("after is a sequence number (ASCII digits).")
    rows = None
    if "rows" in request.GET:
        try:
            rows = [selectors.parse_run_id(part) for part in request.GET["rows"].split(",")
                    if part][:MAX_ASKED]
        except RunNotFound:
            raise BadRequest("rows are run ids, comma-separated.") from None
    return TemplateResponse(request, "runs/_panel_parts.html", page_context(
        request, **run_panel(run_id, parts=parts, after=after, rows=rows), parts=parts))


def run_panel(run_id, *, parts=selectors.PAGE_PARTS, after=None, rows=None) -> dict:
    """What the panel's ``parts`` show (all by default); see ``panel``."""
    try:
        page = selectors.run_page(run_id=run_id, parts=parts, after=after, rows=rows)
    except RunNotFound:
        raise Http404("No such run.") from None
    run = with_pending([page["run"]])[0]
    context = {"rows": None, **page, "after": after, "page_events": selectors.PAGE_EVENTS}
    if {"summary", "requests", "timeline", "trace"} & set(parts):
        context.update(activity.activity_facts(run_id=run.id))
    changed = page.get("state_events", [])
    if "summary" in parts:
        context.update(
            state_since=changed[-1].at if changed else run.created_at,
            reruns=list(selectors.runs().filter(rerun_of_id=run.id).select_related(None)
                        .order_by("created_at").only("id", "created_at")))
    if "ask" in parts:
        context.update(review_links=review.review_links(run_id=run.id),
                       policy_reasons=POLICY_REASONS, raise_limit=raise_limit(run))
    if {"requests", "trace"} & set(parts):
        context["requests"] = control_rows(page["intents"], context["live_requests"], changed)
    if "trace" in parts:
        context["trace"] = trace.run_trace(run, attempts=page["attempts"],
                                           requests=context["requests"],
                                           events=page["trace_events"])
    if "timeline" in parts:
        # Newest first; a live request (a pause) shows where it was taken, before its
        # effect. The events after a seq come alone: the page has its live requests.
        requests = context["live_requests"] if after is None else []
        timeline = sorted([*((event.at, 1, "event", event) for event in page["events"]),
                           *((entry.at, 0, "request", entry) for entry in requests)],
                          key=lambda item: item[:2], reverse=True)
        context["timeline"] = [(kind, item) for _, _, kind, item in timeline]
    return context


# Tickets the host's policies open (not the agent or an operator): the page says why.
POLICY_REASONS = (TicketReason.BUDGET, TicketReason.PROVIDER, TicketReason.LOOP)


def raise_limit(run) -> dict | None:
    """For a run paused at a budget (or by the loop guard): the budget reached, its value,
    and a suggested new one (twice as much), for the page's form."""
    ticket = run.ticket if run.ticket_id is not None else None
    if ticket is None or ticket.reason not in (TicketReason.BUDGET, TicketReason.LOOP):
        return None
    prompt = ticket.prompt if isinstance(ticket.prompt, dict) else {}
    rule = limits.BUDGET_BY_KEY.get(prompt.get("limit"))
    if rule is None:
        return None
    current = getattr(run, rule.key)
    suggested = None if current is None else min(rule.maximum, current * 2)
    if suggested is not None and rule.integral:
        suggested = int(max(suggested, current + 1))
    return {"rule": rule, "current": current, "suggested": suggested}


def control_rows(intents, live_requests, events) -> list[dict]:
    """The control requests of a run, oldest first: the durable ones (cancel, stop) with
    their requested, delivered and committed times, and the live ones its attempts took
    (pauses), committed when the attempt that took one paused."""
    rows = [{"action": intent.action, "by": intent.requested_by,
             "source": intent.get_source_display(), "reason": intent.reason or "",
             "at": intent.requested_at, "delivered": intent.delivered_at,
             "committed": intent.applied_at, "receipt": intent.receipt} for intent in intents]
    sources = dict(Source.choices)
    for entry in live_requests:
        data = entry.data or {}
        paused = next((event.at for event in events if event.kind == EventKind.PAUSED
                       and event.generation == entry.generation and event.at >= entry.at),
                      None)
        rows.append({"action": data.get("action", "pause"), "by": data.get("actor") or "",
                     "source": sources.get(data.get("source"), data.get("source") or ""),
                     "reason": "", "at": entry.at, "delivered": entry.at,
                     "committed": paused})
    return sorted(rows, key=lambda row: row["at"])


@viewer_required
@require_GET
def activity_log(request, run_id):
    """A run's activity log: its newest entries, or with ``?all=1`` every one kept."""
    run = run_panel_run(run_id)
    if "after" in request.GET:  # the entries the page has not shown yet, as list items
        after = limits.plain_integer(request.GET["after"])
        if after is None:
            raise BadRequest("after is a sequence number (ASCII digits).")
        return TemplateResponse(request, "runs/_activity_entries.html", {
            "entries": activity.run_activity(run_id=run.id, after=after)[:activity.SHOWN],
            "activity_total": activity.activity_count(run_id=run.id)})
    shown_all = request.GET.get("all") == "1"
    entries = activity.run_activity(run_id=run.id, last=None if shown_all else activity.SHOWN)
    return TemplateResponse(request, "runs/activity.html" if shown_all else "runs/_activity.html", {
        "run": run, "entries": entries, "shown_all": shown_all,
        "activity_total": activity.activity_count(run_id=run.id)})


def run_panel_run(run_id):
    try:
        return selectors.run_get(run_id)
    except RunNotFound:
        raise Http404("No such run.") from None


@require_GET
def favicon(request):
    """Browsers ask for /favicon.ico on their own: the site's icon is a static SVG."""
    return redirect(static("runs/favicon.svg"), permanent=True)


metrics = stop_metrics.MetricsView.as_view()


@require_GET
def healthz(request):
    """Database reachable (else 503), broker reachable, and how many workers answer a ping;
    answered within a second whatever the load (``runs.pages.health``)."""
    now = health.prober.current()
    return JsonResponse(now.as_json(), status=200 if now.db == "ok" else 503)


def wants_html(request) -> bool:
    """A browser asking for a page (it lists text/html before any JSON), not a script."""
    accept = request.headers.get("Accept", "")
    html, json_ = accept.find("text/html"), accept.find("application/json")
    return html >= 0 and (json_ < 0 or html < json_)


# A link that cannot be used says why, with the status the JSON answer has.
LINK_PROBLEMS = {"link_expired": "This link has expired.", "link_used": "This link was "
                 "already used.", "link_revoked": "This link was withdrawn.",
                 "link_stale": "This request was already answered, or the run ended.",
                 "not_found": "There is no such review link."}


@require_GET
def review_page(request, token):
    """The page a reviewer without an account opens: the run's agent and the ticket's
    prompt, nothing else; it answers through the same link (``runs.api.review``)."""
    try:
        found = review.review_link_open(token=token)
    except ServiceError as error:
        return TemplateResponse(request, "runs/review.html", {
            "problem": LINK_PROBLEMS.get(error.code, error.message)}, status=error.status)
    return TemplateResponse(request, "runs/review.html", {"review": found})


