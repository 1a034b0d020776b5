"""Run the whole system in one process on the embedded defaults (``make run``)."""

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve the site with daphne; on first start, create an 'admin' operator."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, host, port, **options):
        self.ensure_admin()
        from channels.routing import get_default_application
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server

        self.stdout.write(f"awaken-site on http://{host}:{port}/")
        Server(
            application=get_default_application(),
            endpoints=build_endpoint_description_strings(host=host, port=port),
            verbosity=0,
        ).run()

    def ensure_admin(self):
        User = get_user_model()
        if User.objects.exists():
            return
        password = secrets.token_urlsafe(12)
        user = User.objects.create_superuser("admin", password=password)
        user.groups.add(Group.objects.get(name="operator"))
        self.stdout.write(f"Created operator 'admin' with password: {password}")
