"""Who is asking, on a websocket handshake.

Scripts send ``Authorization: Token <key>`` (with or without an Origin); browsers send their
session cookie and must come from this site's own origin, decided as Django's CSRF check
decides it for a POST. Anyone else is refused by the consumer.
"""

import io
from collections import defaultdict
from urllib.parse import urlsplit

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.utils.http import is_same_domain
from rest_framework.authtoken.models import Token


@database_sync_to_async
def token_holder(key: str) -> tuple:
    """The active user a token key belongs to, and the token's id; anonymous otherwise."""
    token = Token.objects.select_related("user").filter(key=key).first()
    if token is None or not token.user.is_active:
        return AnonymousUser(), None
    return token.user, token.pk


def token_users(token_ids) -> dict:
    """The tokens of ``token_ids`` that still exist, with the id of the user of each."""
    return dict(Token.objects.filter(pk__in=token_ids).values_list("pk", "user_id"))


def origin_allowed(scope) -> bool:
    """Whether a handshake's Origin is one a POST from that browser would pass Django's CSRF
    origin check with: exactly the scheme, host and port the request was sent to (the host
    one of ``ALLOWED_HOSTS``, the scheme as ``SECURE_PROXY_SSL_HEADER`` says), or one of
    ``CSRF_TRUSTED_ORIGINS``, wildcards included."""
    secure = scope.get("scheme") in ("wss", "https")
    request = ASGIRequest({**scope, "type": "http", "method": "GET",
                           "scheme": "https" if secure else "http"}, io.BytesIO())
    origin = request.META.get("HTTP_ORIGIN")
    if not origin:
        return False
    try:
        if origin == f"{request.scheme}://{request.get_host()}":
            return True
    except DisallowedHost:
        pass
    trusted = settings.CSRF_TRUSTED_ORIGINS
    if origin in {candidate for candidate in trusted if "*" not in candidate}:
        return True
    subdomains = defaultdict(list)
    for candidate in (urlsplit(candidate) for candidate in trusted if "*" in candidate):
        subdomains[candidate.scheme].append(candidate.netloc.lstrip("*"))
    try:
        parsed = urlsplit(origin)
    except ValueError:
        return False
    return any(is_same_domain(parsed.netloc, domain) for domain in subdomains[parsed.scheme])


class SocketAuth:
    def __init__(self, inner):
        self.token_app = inner
        self.browser_app = AuthMiddlewareStack(inner)

    async def __call__(self, scope, receive, send):
        header = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
        kind, _, key = header.partition(" ")
        if kind == "Token" and key:
            user, token_id = await token_holder(key.strip())
            scope = {**scope, "user": user, "awaken.token": token_id}
            return await self.token_app(scope, receive, send)
        if not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.browser_app(scope, receive, send)
