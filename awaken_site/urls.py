from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt

from runs.api import review
from runs.pages import views

handler404 = "runs.api.errors.not_found"

review_answer = review.ReviewView.as_view()


@csrf_exempt  # as the API view it hands over to: the link is the credential, not a cookie
def review_link(request, token):
    """A review link: its page for a browser that opens it, JSON for a script (and for the
    page's own answer)."""
    if request.method == "GET" and views.wants_html(request):
        return views.review_page(request, token)
    return review_answer(request, token=token)


urlpatterns = [
    path("", views.index, name="runs-index"),
    path("runs/rows/", views.rows, name="runs-rows"),
    path("runs/<uuid:run_id>/", views.detail, name="runs-page"),
    path("runs/<uuid:run_id>/panel/", views.panel, name="runs-panel"),
    path("overview/", views.overview, name="runs-overview-page"),
    path("bulk/", views.bulk_jobs, name="runs-bulk-page"),
    path("bulk/rows/", views.bulk_rows, name="runs-bulk-rows"),
    path("bulk/<uuid:job_id>/", views.bulk_job, name="runs-bulk-job-page"),
    path("workers/", views.workers, name="runs-workers-page"),
    # Browsers ask for /favicon.ico on their own; the site's icon is a static SVG.
    path("favicon.ico", views.favicon, name="favicon"),
    path("runs/<uuid:run_id>/activity/", views.activity_log, name="runs-activity"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    # A review link: whoever holds it answers one ticket, with no account.
    path("review/<str:token>/", review_link, name="runs-review"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", include("runs.api.urls")),
]
