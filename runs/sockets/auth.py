"""Who is asking, on a websocket handshake.

Scripts send ``Authorization: Token <key>`` (with or without an Origin); browsers send their
session cookie and must come from an allowed origin. Anyone else is refused by the consumer.
"""

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator
from django.contrib.auth.models import AnonymousUser
from rest_framework.authtoken.models import Token


@database_sync_to_async
def user_for_token(key: str):
    token = Token.objects.select_related("user").filter(key=key).first()
    if token is None or not token.user.is_active:
        return AnonymousUser()
    return token.user


class SocketAuth:
    def __init__(self, inner):
        self.token_app = inner
        self.browser_app = AllowedHostsOriginValidator(AuthMiddlewareStack(inner))

    async def __call__(self, scope, receive, send):
        header = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
        kind, _, key = header.partition(" ")
        if kind == "Token" and key:
            scope = {**scope, "user": await user_for_token(key.strip())}
            return await self.token_app(scope, receive, send)
        return await self.browser_app(scope, receive, send)
