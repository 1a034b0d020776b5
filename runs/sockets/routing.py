from django.urls import path, re_path

from runs.sockets.auth import StreamAuth
from runs.sockets.consumers import Refused, RunsConsumer
from runs.sockets.daphne import DaphneBackPressure
from runs.sockets.events import OwnContext, RunStream

websocket_urlpatterns = [
    path("ws/runs/", RunsConsumer.as_asgi()),
    path("ws/runs/<str:run_id>/", RunsConsumer.as_asgi()),
    re_path(r"", Refused.as_asgi()),  # last: an unknown path is refused at the handshake
]

# Server-sent events, ahead of Django (which serves every other HTTP path).
run_stream = OwnContext(DaphneBackPressure(StreamAuth(RunStream.as_asgi())))
http_urlpatterns = [
    path("api/runs/stream/", run_stream),
    path("api/runs/<str:run_id>/stream/", run_stream),
]
