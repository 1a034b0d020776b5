"""API keys: made here, shown once, kept as a SHA-256 digest.

A key is 32 random bytes in URL-safe base64. Nobody guesses one, so a fast digest is
enough: a check costs one hash and one indexed read, never a password hasher's CPU. Keys
that DRF's authtoken made before (40 hex digits) were carried over hashed the same way
(migration 0008). Both the REST API and the websocket handshake check keys here.
"""

import hashlib
import re
import secrets

from django.db import transaction
from django.utils import timezone

from runs.domain import throttle
from runs.domain.errors import TooManyFailures
from runs.models import ApiKey, AuthScope

PREFIX_LENGTH = 8
# What a key can look like; anything else is refused without a lookup.
KEY_FORMAT = re.compile(r"[A-Za-z0-9_-]{32,64}")


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@transaction.atomic
def api_key_issue(*, user) -> str:
    """Make a new key for ``user`` and return it: the one time it exists in the clear. The
    key it replaces stops working at once."""
    key = secrets.token_urlsafe(32)
    ApiKey.objects.update_or_create(user=user, defaults={
        "prefix": key[:PREFIX_LENGTH], "digest": key_digest(key), "created_at": timezone.now()})
    return key


def user_for_api_key(*, key: str, address: str):
    """The active user whose key ``key`` is, or None.

    1. While the client's address or the key's prefix is locked, raise TooManyFailures
       before looking (``runs.domain.throttle``).
    2. Look the key up by its digest.
    3. If no active user has it, count a failure for the address and the prefix.
    """
    well_formed = KEY_FORMAT.fullmatch(key) is not None
    idents = [(AuthScope.ADDRESS, address[:64])]
    if well_formed:
        idents.append((AuthScope.KEY_PREFIX, key[:PREFIX_LENGTH]))
    wait = throttle.locked_for(idents)
    if wait:
        raise TooManyFailures(wait)
    found = (ApiKey.objects.select_related("user").filter(digest=key_digest(key)).first()
             if well_formed else None)
    if found is not None and found.user.is_active:
        return found.user
    throttle.failure_record(idents)
    return None
