"""Who is asking, on a websocket handshake.

Scripts send ``Authorization: Token <key>`` (with or without an Origin); browsers send their
session cookie and must come from this site's own origin, decided as Django's CSRF check
decides it for a POST. Anyone else is refused by the consumer.
"""

from collections import defaultdict
from urllib.parse import urlsplit

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest
from django.utils.http import is_same_domain

from runs.domain.errors import KeyRevoked, TooManyFailures
from runs.domain.keys import key_digest, user_for_api_key
from runs.models import ApiKey


@database_sync_to_async
def token_holder(key: str, address: str) -> tuple:
    """The active user an API key belongs to, checked as the REST API checks it (throttle
    included), and the key's digest, which names the key while the socket is open;
    anonymous (and None) otherwise."""
    try:
        user = user_for_api_key(key=key, address=address)
    except (TooManyFailures, KeyRevoked):
        user = None
    if user is None:
        return AnonymousUser(), None
    return user, key_digest(key)


def token_users(digests) -> dict:
    """The keys among ``digests`` that still exist (not revoked, not replaced), with the id
    of the user of each."""
    return dict(ApiKey.objects.filter(digest__in=digests).values_list("digest", "user_id"))


def origin_allowed(scope) -> bool:
    """Whether a handshake's Origin is one a POST from that browser would pass Django's CSRF
    origin check with: exactly the scheme, host and port the request was sent to (the host
    one of ``ALLOWED_HOSTS``, the scheme as ``SECURE_PROXY_SSL_HEADER`` says), or one of
    ``CSRF_TRUSTED_ORIGINS``, wildcards included."""
    request = handshake_request(scope)
    origin = request.META.get("HTTP_ORIGIN")
    if not origin:
        return False
    try:
        if origin == f"{handshake_scheme(scope, request)}://{request.get_host()}":
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


def handshake_request(scope) -> HttpRequest:
    """A plain request carrying the handshake's headers and server address, for Django's own
    ``get_host`` (which checks ``ALLOWED_HOSTS``)."""
    request = HttpRequest()
    for name, value in scope.get("headers", ()):
        key = name.decode("latin-1").upper().replace("-", "_")
        request.META[f"HTTP_{key}"] = value.decode("latin-1")
    server = scope.get("server") or ("localhost", 80)
    request.META["SERVER_NAME"] = server[0]
    request.META["SERVER_PORT"] = str(server[1] if server[1] is not None else 80)
    return request


def handshake_scheme(scope, request: HttpRequest) -> str:
    """The scheme a POST from the same page would have had: as the TLS proxy's header says
    when ``SECURE_PROXY_SSL_HEADER`` is set (as ``HttpRequest.scheme`` reads it), else as
    the connection was made."""
    if settings.SECURE_PROXY_SSL_HEADER:
        header, secure_value = settings.SECURE_PROXY_SSL_HEADER
        value = request.META.get(header)
        if value is not None:
            return "https" if value.split(",", 1)[0].strip() == secure_value else "http"
    return "https" if scope.get("scheme") in ("wss", "https") else "http"


def presented_token(scope) -> str | None:
    """The key of an ``Authorization: Token <key>`` header, if there is one."""
    header = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
    kind, _, key = header.partition(" ")
    return key.strip() if kind == "Token" and key.strip() else None


async def with_token_holder(scope, key: str) -> dict:
    """``scope`` with the user of API key ``key`` (anonymous if it lets no one in) and the
    key's digest."""
    address = (scope.get("client") or [""])[0] or ""
    user, digest = await token_holder(key, address)
    return {**scope, "user": user, "awaken.token": digest,
            "awaken.token_refused": digest is None}


class StreamAuth:
    """Who is asking, on an HTTP stream (server-sent events): as the REST API decides, an
    ``Authorization: Token`` header, else the session cookie. A GET changes nothing, so no
    Origin is asked for, as Django's CSRF check asks none of a GET."""

    def __init__(self, inner):
        self.token_app = inner
        self.browser_app = AuthMiddlewareStack(inner)

    async def __call__(self, scope, receive, send):
        key = presented_token(scope)
        if key is not None:
            return await self.token_app(await with_token_holder(scope, key), receive, send)
        return await self.browser(scope, receive, send)

    async def browser(self, scope, receive, send):
        return await self.browser_app(scope, receive, send)


class SocketAuth(StreamAuth):
    """Who is asking, on a websocket handshake: as on a stream, except that a browser's
    session counts only from this site's own origin (a socket is opened by any page)."""

    async def browser(self, scope, receive, send):
        if not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await super().browser(scope, receive, send)
