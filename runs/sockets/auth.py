"""Who is asking, on a websocket handshake.

Scripts send ``Authorization: Token <key>`` (with or without an Origin); browsers send their
session cookie and must come from an allowed origin. Anyone else is refused by the consumer.
"""

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator
from django.contrib.auth.models import AnonymousUser

from runs.domain.errors import TooManyFailures
from runs.domain.keys import user_for_api_key


@database_sync_to_async
def user_for_token(key: str, address: str):
    """The same check as the REST API's, throttle included; refused means anonymous."""
    try:
        return user_for_api_key(key=key, address=address) or AnonymousUser()
    except TooManyFailures:
        return AnonymousUser()


class SocketAuth:
    def __init__(self, inner):
        self.token_app = inner
        self.browser_app = AllowedHostsOriginValidator(AuthMiddlewareStack(inner))

    async def __call__(self, scope, receive, send):
        header = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
        kind, _, key = header.partition(" ")
        if kind == "Token" and key:
            address = (scope.get("client") or [""])[0] or ""
            scope = {**scope, "user": await user_for_token(key.strip(), address)}
            return await self.token_app(scope, receive, send)
        return await self.browser_app(scope, receive, send)
