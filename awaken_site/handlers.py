"""The HTTP side of the ASGI application."""

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler, with the middleware and the view run as one synchronous call.

    Every view of the site is synchronous, and so is part of the middleware. Django's own
    ASGI handler builds an async chain and hops between the event loop and a worker thread
    at each middleware that has a sync part (about a dozen hops per request here). This
    handler builds the chain Django builds for WSGI and enters it once, in the request's
    own thread (``ThreadSensitiveContext``), so a request costs a single hop. Websockets
    are served by the consumers and do not pass through here.
    """

    def load_middleware(self, is_async=False):
        super().load_middleware(is_async=False)
        self._middleware_chain = sync_to_async(self._middleware_chain, thread_sensitive=True)
