from django.urls import path

from runs.sockets.consumers import RunsConsumer

websocket_urlpatterns = [
    path("ws/runs/", RunsConsumer.as_asgi()),
    path("ws/runs/<str:run_id>/", RunsConsumer.as_asgi()),
]
