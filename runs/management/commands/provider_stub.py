"""Serve the provider stub alone: an OpenAI-compatible chat completions API for offline use."""

import uvicorn
from django.core.management.base import BaseCommand

from runs.providers.stub import Stub


class Command(BaseCommand):
    help = ("Serve the provider stub (OpenAI-compatible chat completions with canned and echo "
            "replies); point AWAKEN_PROVIDER_BASE_URL at the URL it prints.")

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8100)
        parser.add_argument("--pace", type=float, default=0.04,
                            help="Seconds between streamed chunks (per request: +pace=S).")

    def handle(self, host, port, pace, **options):
        self.stdout.write(f"Provider stub: AWAKEN_PROVIDER_BASE_URL=http://{host}:{port}/v1 "
                          "with a model such as 'canned' or 'echo' (flags: "
                          "runs/providers/stub.py).", self.style.SUCCESS)
        uvicorn.run(Stub(pace=pace), host=host, port=port, lifespan="off",
                    log_level="warning", access_log=False)
