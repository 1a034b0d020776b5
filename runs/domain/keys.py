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

from runs.domain import roles, throttle
from runs.domain.errors import TooManyFailures
from runs.domain.prepared import Prepared
from runs.models import ApiKey, AuthFailure, AuthScope

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


def _key_lookup(*, digest, address, prefix, since, failures):
    idents = [(AuthScope.ADDRESS, address), (AuthScope.KEY_PREFIX, prefix)]
    return (ApiKey.objects.select_related("user")
            .annotate(locked=throttle.last_lock(idents, since=since, failures=failures),
                      **roles.role_annotations("user_id"))
            .filter(digest=digest).order_by("pk")[:1])


# A key with its user, the locks of its address and prefix, and the user's roles.
KEY_LOOKUP = Prepared(
    _key_lookup, digest=ApiKey._meta.get_field("digest"),
    address=AuthFailure._meta.get_field("ident"), prefix=AuthFailure._meta.get_field("ident"),
    since=AuthFailure._meta.get_field("last_failed_at"),
    failures=AuthFailure._meta.get_field("failures"))


def user_for_api_key(*, key: str, address: str):
    """The active user whose key ``key`` is, or None.

    1. While the client's address or the key's prefix is locked, raise TooManyFailures,
       whether the key is right or not (``runs.domain.throttle``).
    2. Look the key up by its digest; a right key is read with the locks and the user's
       roles in one query.
    3. If no active user has it, count a failure for the address and the prefix.

    A good key costs one statement: its lookup reads the locks too. Only a key that is not
    found needs a statement of its own for them.
    """
    well_formed = KEY_FORMAT.fullmatch(key) is not None
    idents = [(AuthScope.ADDRESS, address[:64])]
    if well_formed:
        idents.append((AuthScope.KEY_PREFIX, key[:PREFIX_LENGTH]))
        now = timezone.now()
        found = KEY_LOOKUP.first(digest=key_digest(key), address=address[:64],
                                 prefix=key[:PREFIX_LENGTH], **throttle.lock_bounds(now))
        if found is not None:
            wait = throttle.seconds_left(found.locked, now)
            if wait:
                raise TooManyFailures(wait)
            if found.user.is_active:
                roles.remember_roles(found.user, found)
                return found.user
    wait = throttle.locked_for(idents)
    if wait:
        raise TooManyFailures(wait)
    throttle.failure_record(idents)
    return None
