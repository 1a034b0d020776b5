from functools import wraps

from django.shortcuts import render
from django.urls import path
from drf_spectacular.views import SpectacularSwaggerSplitView
from rest_framework.exceptions import NotAuthenticated

from runs.api import bulk, console, review, views, webhooks


class DocsView(SpectacularSwaggerSplitView):
    """The interactive docs; a visitor who is not logged in gets a page with a login link
    (not a bare 401)."""

    def handle_exception(self, exc):
        if isinstance(exc, NotAuthenticated) and self.request.method == "GET":
            return render(self.request, "runs/docs_login.html",
                          {"next": self.request.get_full_path()}, status=401)
        return super().handle_exception(exc)


def beside(literal, by_id, **id_kwargs):
    """The view of a literal segment beside an id (``runs/batch/`` beside
    ``runs/<run_id>/``): the methods ``literal`` has are its own; any other is ``by_id``'s,
    with the segment as the id. ``GET /api/runs/batch/`` then answers as every id that is not
    a UUID does (404 ``not_found``), where the literal's view alone would answer 405."""
    own = {method for method in literal.view_class.http_method_names
           if hasattr(literal.view_class, method)}

    @wraps(literal)  # its attributes too: exempt from CSRF, its class for the schema
    def view(request, *args, **kwargs):
        if request.method.lower() in own:
            return literal(request, *args, **kwargs)
        return by_id(request, **id_kwargs)
    return view


urlpatterns = [
    path("runs/", views.RunListView.as_view(), name="runs-list"),
    path("runs/batch/", beside(views.RunBatchView.as_view(), views.RunDetailView.as_view(),
                               run_id="batch"), name="runs-batch"),
    # <str:run_id>: an id that is not a UUID is a JSON 404, not Django's HTML page.
    path("runs/<str:run_id>/", views.RunDetailView.as_view(), name="runs-detail"),
    path("runs/<str:run_id>/events/", views.RunEventsView.as_view(), name="runs-events"),
    path("runs/<str:run_id>/activity/", views.RunActivityView.as_view(),
         name="runs-activity-list"),
    path("runs/<str:run_id>/cancel/", views.RunCancelView.as_view(), name="runs-cancel"),
    path("runs/<str:run_id>/stop/", views.RunStopView.as_view(), name="runs-stop"),
    path("runs/<str:run_id>/resume/", views.RunResumeView.as_view(), name="runs-resume"),
    path("runs/<str:run_id>/pause/", views.RunPauseView.as_view(), name="runs-pause"),
    path("runs/<str:run_id>/deliver/", views.RunDeliverView.as_view(), name="runs-deliver"),
    path("runs/<str:run_id>/rerun/", console.RunRerunView.as_view(), name="runs-rerun"),
    path("runs/<str:run_id>/review-links/", review.ReviewLinksView.as_view(),
         name="runs-review-links"),
    path("runs/<str:run_id>/review-links/<str:link_id>/revoke/",
         review.ReviewLinkRevokeView.as_view(), name="runs-review-link-revoke"),
    path("events/", views.EventListView.as_view(), name="runs-events-all"),
    path("overview/", console.OverviewView.as_view(), name="runs-overview"),
    path("workers/", console.WorkerListView.as_view(), name="workers-list"),
    path("workers/<str:name>/drain/", console.WorkerDrainView.as_view(), name="workers-drain"),
    path("workers/<str:name>/undrain/", console.WorkerUndrainView.as_view(),
         name="workers-undrain"),
    path("bulk/", bulk.BulkListView.as_view(), name="runs-bulk"),
    path("bulk/preview/", beside(bulk.BulkPreviewView.as_view(), bulk.BulkDetailView.as_view(),
                                 job_id="preview"), name="runs-bulk-preview"),
    path("bulk/<str:job_id>/", bulk.BulkDetailView.as_view(), name="runs-bulk-detail"),
    path("bulk/<str:job_id>/abort/", bulk.BulkAbortView.as_view(), name="runs-bulk-abort"),
    path("webhooks/", webhooks.WebhooksView.as_view(), name="webhooks"),
    path("webhooks/<str:endpoint_id>/deliveries/", webhooks.DeliveriesView.as_view(),
         name="webhooks-deliveries"),
    path("webhooks/<str:endpoint_id>/deliveries/<str:delivery_id>/redeliver/",
         webhooks.RedeliverView.as_view(), name="webhooks-redeliver"),
    path("schema/", views.SchemaView.as_view(), name="runs-schema"),
    # The split view serves its start-up script from a URL: the CSP allows no inline script.
    path("docs/", DocsView.as_view(
        url_name="runs-schema", template_name="runs/swagger_ui.html"), name="runs-docs"),
]
