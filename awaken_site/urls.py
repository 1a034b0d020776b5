from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from runs.api import review
from runs.pages import views

handler404 = "runs.api.errors.not_found"

urlpatterns = [
    path("", views.index, name="runs-index"),
    path("runs/rows/", views.rows, name="runs-rows"),
    path("runs/<uuid:run_id>/", views.detail, name="runs-page"),
    path("runs/<uuid:run_id>/panel/", views.panel, name="runs-panel"),
    path("overview/", views.overview, name="runs-overview-page"),
    path("bulk/", views.bulk_jobs, name="runs-bulk-page"),
    # Browsers ask for /favicon.ico on their own; the site's icon is a static SVG.
    path("favicon.ico", views.favicon, name="favicon"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    # A review link: whoever holds it answers one ticket, with no account (JSON for now).
    path("review/<str:token>/", review.ReviewView.as_view(), name="runs-review"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", include("runs.api.urls")),
]
