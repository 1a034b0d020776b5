"""API keys: made here, shown once, kept as a SHA-256 digest.

A key is 32 random bytes in URL-safe base64. Nobody guesses one, so a fast digest is
enough: a check costs one hash and one indexed read, never a password hasher's CPU. Keys
that DRF's authtoken made before (40 hex digits) were carried over hashed the same way
(migration 0008). Both the REST API and the websocket handshake check keys here.
"""

import hashlib
import re
import secrets
from functools import cache

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from runs.domain import roles, throttle
from runs.domain.errors import KeyRevoked, TooManyFailures
from runs.domain.sql import quoted, rows
from runs.models import ApiKey, AuthScope, RevokedApiKey

PREFIX_LENGTH = 8
# What a key can look like; anything else is refused without a lookup.
KEY_FORMAT = re.compile(r"[A-Za-z0-9_-]{32,64}")


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@transaction.atomic
def api_key_issue(*, user) -> str:
    """Make a new key for ``user`` and return it: the one time it exists in the clear. The
    key it replaces stops working at once, and is remembered as revoked."""
    key = secrets.token_urlsafe(32)
    old = ApiKey.objects.select_for_update().filter(user=user).first()
    if old is not None:
        _retire(old)
    ApiKey.objects.update_or_create(user=user, defaults={
        "prefix": key[:PREFIX_LENGTH], "digest": key_digest(key), "created_at": timezone.now()})
    return key


def _retire(old: ApiKey) -> None:
    RevokedApiKey.objects.get_or_create(digest=old.digest, defaults={
        "user_id": old.user_id, "prefix": old.prefix, "revoked_at": timezone.now()})


ROLE_BITS = "_awaken_role_bits"  # the key lookup's column of the user's roles


@cache
def _key_lookup_sql() -> str:
    """The user whose key has a given digest, with the roles the user has as one number (a
    bit for each role of ``roles.ROLES``, in order), in one statement.

    Written by hand (``sql.rows``): every request with a key makes it, and through the
    query compiler its subqueries cost several times the statement's own time
    (``manage.py bench sql``). The roles are one subquery, not an ``EXISTS`` for each:
    PostgreSQL plans that in under half the time, and behind a transaction pooler
    (``DB_POOLER``), where nothing is prepared, it plans it at every request.
    tests/test_reads.py holds it to the queryset's result."""
    user = get_user_model()
    meta, key = user._meta, ApiKey._meta
    through = meta.get_field("groups").remote_field.through._meta

    def column(options, name):
        return quoted(options.get_field(name).column)

    bits = " ".join(f"WHEN %s THEN {1 << bit}" for bit in range(len(roles.ROLES)))
    held = (f"(SELECT COALESCE(SUM(CASE g.{column(Group._meta, 'name')} {bits} END), 0) "
            f"FROM {quoted(through.db_table)} m JOIN {quoted(Group._meta.db_table)} g ON "
            f"g.{column(Group._meta, 'id')} = m.{column(through, 'group')} "
            f"WHERE m.{column(through, 'user')} = u.{column(meta, meta.pk.name)}) "
            f"AS {quoted(ROLE_BITS)}")
    columns = ", ".join(f"u.{quoted(f.column)}" for f in meta.concrete_fields)
    return (f"SELECT {columns}, {held} FROM {quoted(meta.db_table)} u "
            f"JOIN {quoted(key.db_table)} k ON k.{column(key, 'user')} = "
            f"u.{column(meta, meta.pk.name)} WHERE k.{column(key, 'digest')} = %s")


def key_lookup_queryset(*, digest):
    """``key_lookup`` as a queryset of the key (the role flags annotated): what
    tests/test_reads.py and ``manage.py bench sql`` hold it to."""
    return (ApiKey.objects.select_related("user")
            .annotate(**roles.role_annotations("user_id"))
            .filter(digest=digest).order_by("pk")[:1])


def key_lookup(*, digest: str):
    """The user with the key of ``digest``, or None; on it the role flags
    ``roles.remember_roles`` reads."""
    found = rows(get_user_model(), _key_lookup_sql(), [*roles.ROLES, digest],
                 extra=(ROLE_BITS,))
    if not found:
        return None
    user = found[0]
    held = getattr(user, ROLE_BITS)
    for bit, role in enumerate(roles.ROLES):
        setattr(user, f"_awaken_has_{role}", bool(held & (1 << bit)))
    return user


def user_for_api_key(*, key: str, address: str):
    """The active user whose key ``key`` is, or None.

    The lock falls on what failed, never on a good key:

    1. Look the key up by its digest; a right key of an active user is let in whatever its
       address did before (one statement, the user's roles read with it).
    2. A key that is known but no longer works (replaced, revoked, or its user
       deactivated) raises KeyRevoked: a stale key is a mistake to report, not a guess.
    3. Anything else is a guess: while the client's address is locked, raise
       TooManyFailures; else count a failure for the address (``runs.domain.throttle``).
       No prefix is ever counted: knowing a key's first characters (the admin shows them)
       must not lock the key.
    """
    address = address[:64]
    if KEY_FORMAT.fullmatch(key) is not None:
        digest = key_digest(key)
        found = key_lookup(digest=digest)
        if found is not None:
            if found.is_active:
                roles.remember_roles(found, found)
                return found
            raise KeyRevoked("This API key's user is deactivated.")
        revoked = RevokedApiKey.objects.filter(digest=digest).values_list(
            "revoked_at", flat=True).first()
        if revoked is not None:
            raise KeyRevoked(f"This API key was revoked at {revoked.isoformat()}; "
                             "ask for a new one.")
    idents = [(AuthScope.ADDRESS, address)]
    wait = throttle.locked_for(idents)
    if wait:
        raise TooManyFailures(wait)
    throttle.failure_record(idents)
    return None
