from django.urls import path, re_path

from runs.sockets.consumers import Refused, RunsConsumer

websocket_urlpatterns = [
    path("ws/runs/", RunsConsumer.as_asgi()),
    path("ws/runs/<str:run_id>/", RunsConsumer.as_asgi()),
    re_path(r"", Refused.as_asgi()),  # last: an unknown path is refused at the handshake
]
