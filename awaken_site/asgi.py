"""The ASGI application: HTTP to Django, websockets to the consumers.

Every view is synchronous, so HTTP is served by Django's WSGI handler through
``WsgiOnThreads``: a request's middleware and view run as one call on a thread kept from one
request to the next, handed the request once and handing back the response once. Django's
ASGI handler would hop between the event loop and a thread at each synchronous middleware,
which cost a GET of one run 14 ms of CPU in process against 10 under asgiref's
``WsgiToAsgi`` (and that one hops back to the loop for each part of the response).
``BodySizeLimit`` refuses large bodies before anything reads them,
``AccessLog`` writes the access log, review tokens redacted, and ``RequestShare`` keeps
each client to its share and leaves room for controls.
The two event streams (``/api/runs/stream/``, ``/api/runs/{id}/stream/``) are routed to an
``AsyncHttpConsumer`` instead of Django (``runs.sockets.events``): open for minutes or hours,
each would otherwise hold a thread.
"""

import os

from django.core.wsgi import get_wsgi_application

from awaken_site.wsgi_threads import WsgiOnThreads

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "awaken_site.settings")
# get_wsgi_application sets Django up before the imports below.
django_app = WsgiOnThreads(get_wsgi_application())

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import re_path  # noqa: E402

from awaken_site.body_limit import BodySizeLimit  # noqa: E402
from awaken_site.logs import AccessLog  # noqa: E402
from awaken_site.request_share import RequestShare  # noqa: E402
from runs.changes.stream import stream  # noqa: E402
from runs.sockets import routing  # noqa: E402
from runs.sockets.auth import SocketAuth  # noqa: E402
from runs.sockets.daphne import (  # noqa: E402
    DaphneBackPressure,
    serve_bodies_unparsed,
    serve_without_twisteds_access_log,
)
from runs.sockets.shutdown import Draining  # noqa: E402

serve_bodies_unparsed()  # Django parses a POST body; daphne's Twisted need not (daphne.py)
serve_without_twisteds_access_log()  # the site writes its own (awaken_site.logs.AccessLog)
# The channel layer made before anything is served: its backend's import (channels_redis,
# 0.1 s and more) would otherwise fall on the first socket's join, on the loop every
# connection shares, or on the first change's publish, in its request.
stream.prepare()
stream.linger = settings.AWAKEN_PUBLISH_LINGER  # a burst's changes go together

# Draining, outermost: on SIGTERM what is held open answers and ends (runs.sockets.shutdown).
application = Draining(ProtocolTypeRouter({
    # The event streams first, on the loop (no thread each), with daphne's own send: their
    # back-pressure reaches the connection through it (runs.sockets.daphne).
    "http": URLRouter([
        *routing.http_urlpatterns,
        re_path(r"", AccessLog(BodySizeLimit(RequestShare(django_app)))),
    ]),
    "websocket": DaphneBackPressure(SocketAuth(URLRouter(routing.websocket_urlpatterns))),
}))
