"""``Authorization: Token <key>``, checked against the keys' digests (``runs.domain.keys``)."""

from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication

from runs.domain import keys
from runs.domain.errors import KeyRevoked, TooManyFailures


class ApiKeyAuthentication(TokenAuthentication):
    """DRF's token header and its 401 challenge, with hashed keys and throttled failures."""

    address = ""

    def authenticate(self, request):
        # DRF makes one authenticator per request, so the address can wait here.
        self.address = request.META.get("REMOTE_ADDR") or ""
        return super().authenticate(request)

    def authenticate_credentials(self, key):
        try:
            user = keys.user_for_api_key(key=key, address=self.address)
        except TooManyFailures as error:
            raise exceptions.Throttled(
                wait=error.retry_after,
                detail="Too many failed token checks from this address.",
            ) from None
        except KeyRevoked as error:
            raise exceptions.AuthenticationFailed(error.message) from None
        if user is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        return user, None
