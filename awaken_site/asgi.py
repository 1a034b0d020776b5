import gc
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "awaken_site.settings")
django.setup(set_prefix=False)

from django.conf import settings  # noqa: E402

from awaken_site import memory  # noqa: E402
from awaken_site.handlers import SyncChainASGIHandler  # noqa: E402

# Before the server starts its threads: large bodies are mapped apart and given back.
memory.tune(mmap_bytes=settings.AWAKEN_MALLOC_MMAP_BYTES)
memory.start_trimmer(settings.AWAKEN_MALLOC_TRIM_SECONDS)

django_asgi_app = SyncChainASGIHandler()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from runs.sockets import routing  # noqa: E402
from runs.sockets.auth import SocketAuth  # noqa: E402
from runs.sockets.flow import WriteFlow  # noqa: E402

application = ProtocolTypeRouter({
    "http": django_asgi_app,
    "websocket": WriteFlow(SocketAuth(URLRouter(routing.websocket_urlpatterns))),
})

# Everything loaded so far lives as long as the process: keep it out of the cyclic
# collector's way, which otherwise dominates the tail of a fan-out to many sockets.
gc.collect()
gc.freeze()
