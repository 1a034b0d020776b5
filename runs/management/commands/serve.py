"""Run the whole system in one process (``make run``): web, a worker and the sweeper.

The code paths are the production ones; only the transports differ when nothing else is
configured: the in-memory broker and channel layer, which live in this one process. With
no model provider configured, the provider stub is started too, on a port of its own, and
the agents call it: the demo works offline.
"""

import logging
import secrets
import socket
import threading

from celery import current_app as app
from celery.worker import WorkController
from channels.routing import get_default_application
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from runs.changes.stream import stream
from runs.providers.stub import Stub, StubServer
from runs.sockets import daphne
from runs.workers.sweeper import Sweeper
from runs.workers.webhooks import send_due

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Serve the site with daphne, an in-process worker and the sweeper."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--concurrency", type=int, default=4,
                            help="Worker threads taking tasks (attempts run on one loop).")

    def handle(self, host, port, concurrency, **options):
        password = self.ensure_admin()
        application = get_default_application()
        # One process, one stream: it carries the worker's ends, which a waiting cancel
        # answers on, so its changes are sent as they come, a worker's way.
        stream.linger = 0.0
        if not settings.AWAKEN_PROVIDER_BASE_URL:
            stub = start_stub()
            self.stdout.write(f"No model provider configured: the provider stub answers at "
                              f"{stub.url} (model {settings.AWAKEN_PROVIDER_MODEL!r}).")
        start_worker(concurrency)
        start_sweeper()
        self.stdout.write(f"awaken-site on http://{host}:{port}/", self.style.SUCCESS)
        if password:
            self.first_login(password, f"http://{host}:{port}/accounts/login/")
        self.stdout.flush()
        daphne.serve(application, host=host, port=port)

    def ensure_admin(self) -> str | None:
        """On the first start, an operator ``admin`` with a random password (returned)."""
        User = get_user_model()
        if User.objects.exists():
            return None
        password = secrets.token_urlsafe(12)
        user = User.objects.create_superuser("admin", password=password)
        user.groups.add(Group.objects.get_or_create(name="operator")[0])
        return password

    def first_login(self, password: str, url: str) -> None:
        """The first start's password, last of what the site prints, in a box: it is shown
        this once."""
        lines = [f"Created operator 'admin' with password: {password}",
                 f"Log in at {url} (shown only now).",
                 "To set another: SECRET_KEY=$(cat var/secret_key) .venv/bin/python manage.py "
                 "changepassword admin"]
        width = max(len(line) for line in lines)
        rule = "+" + "-" * (width + 2) + "+"
        self.stdout.write("\n".join([rule, *(f"| {line.ljust(width)} |" for line in lines),
                                      rule]), self.style.WARNING)
        self.stdout.flush()  # at once, even when stdout is a file (block-buffered)


def start_stub() -> StubServer:
    """The provider stub on a free local port, made the provider of this process (its
    worker reads the settings when it makes its first model call)."""
    server = StubServer(Stub(pace=STUB_PACE)).start()
    settings.AWAKEN_PROVIDER_BASE_URL = server.url
    settings.AWAKEN_PROVIDER_MODEL = settings.AWAKEN_PROVIDER_MODEL or "canned"
    return server


STUB_PACE = 0.04  # seconds between the stub's chunks: a stream a person can watch


def start_worker(concurrency: int) -> threading.Thread:
    """A Celery worker in a thread of this process (no signal handlers of its own)."""
    worker = WorkController(
        app=app, hostname=f"embedded@{socket.gethostname()}", pool_cls="threads",
        concurrency=concurrency, queues=[settings.CELERY_TASK_DEFAULT_QUEUE],
        without_mingle=True, without_gossip=True, without_heartbeat=True, loglevel="INFO",
    )
    thread = threading.Thread(target=worker.start, name="embedded-worker", daemon=True)
    thread.start()
    return thread


def start_sweeper() -> Sweeper:
    """The sweeper of beat, as a thread of this process; and the webhooks' delivery rounds,
    which beat has a worker run."""

    def send_webhooks():
        while not stop.wait(2.0):
            try:
                send_due()
            except Exception:
                log.warning("sending webhooks failed", exc_info=True)

    stop = threading.Event()
    threading.Thread(target=send_webhooks, name="embedded-webhooks", daemon=True).start()
    return Sweeper(name="embedded-sweeper").start()
