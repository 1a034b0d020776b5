import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "awaken_site.settings")
django_asgi_app = get_asgi_application()  # sets Django up before the imports below

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from awaken_site.body_limit import BodySizeLimit  # noqa: E402
from awaken_site.request_threads import KeptRequestThreads  # noqa: E402
from runs.sockets import routing  # noqa: E402
from runs.sockets.auth import SocketAuth  # noqa: E402
from runs.sockets.daphne import DaphneBackPressure  # noqa: E402

application = ProtocolTypeRouter({
    "http": BodySizeLimit(KeptRequestThreads(django_asgi_app)),
    "websocket": DaphneBackPressure(SocketAuth(URLRouter(routing.websocket_urlpatterns))),
})
