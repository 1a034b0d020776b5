import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "awaken_site.settings")

app = Celery("awaken_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# A remote-control command the command line must know too (celery inspect awaken_prepared).
from runs.workers import readiness  # noqa: E402, F401
