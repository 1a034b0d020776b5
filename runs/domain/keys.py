"""API keys: made here, shown once, kept as a SHA-256 digest.

A key is 32 random bytes in URL-safe base64. Nobody guesses one, so a fast digest is
enough: a check costs one hash and one indexed read, never a password hasher's CPU. Keys
that DRF's authtoken made before (40 hex digits) were carried over hashed the same way
(migration 0008). Both the REST API and the websocket handshake check keys here.
"""

import datetime
import hashlib
import re
import secrets
from functools import cache

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection, transaction
from django.utils import timezone

from runs.domain import roles, throttle
from runs.domain.errors import TooManyFailures
from runs.domain.sql import quoted, rows
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


@cache
def _key_lookup_sql() -> str:
    """The user whose key has a given digest, with the last failure of the address's or
    the prefix's lock (``throttle.last_lock``; NULL when neither is locked) and whether the
    user has each role (``roles.role_annotations``), in one statement.

    Written by hand (``sql.rows``): every request with a key makes it, and through the
    query compiler its three subqueries cost several times the statement's own time
    (``manage.py bench sql``). tests/test_keys.py holds it to the querysets' result."""
    user = get_user_model()
    meta, key, failure = user._meta, ApiKey._meta, AuthFailure._meta
    through = meta.get_field("groups").remote_field.through._meta

    def column(options, name):
        return quoted(options.get_field(name).column)

    failures = quoted(failure.db_table)
    scope, ident = column(failure, "scope"), column(failure, "ident")
    last = column(failure, "last_failed_at")
    lock = (f"(SELECT max({last}) FROM {failures} WHERE (({scope} = %s AND {ident} = %s) OR "
            f"({scope} = %s AND {ident} = %s)) AND {column(failure, 'failures')} >= %s "
            f"AND {last} > %s) AS awaken_locked")
    has = [f"EXISTS (SELECT 1 FROM {quoted(through.db_table)} m JOIN "
           f"{quoted(Group._meta.db_table)} g ON g.{column(Group._meta, 'id')} = "
           f"m.{column(through, 'group')} WHERE m.{column(through, 'user')} = "
           f"u.{column(meta, meta.pk.name)} AND g.{column(Group._meta, 'name')} = %s) "
           f"AS {quoted('_awaken_has_' + role)}" for role in roles.ROLES]
    columns = ", ".join(f"u.{quoted(f.column)}" for f in meta.concrete_fields)
    return (f"SELECT {columns}, {lock}, {', '.join(has)} FROM {quoted(meta.db_table)} u "
            f"JOIN {quoted(key.db_table)} k ON k.{column(key, 'user')} = "
            f"u.{column(meta, meta.pk.name)} WHERE k.{column(key, 'digest')} = %s")


def key_lookup_queryset(*, digest, address, prefix, since, failures):
    """``key_lookup`` as a queryset of the key (``locked`` and the role flags annotated):
    what tests/test_keys.py and ``manage.py bench sql`` hold it to."""
    idents = [(AuthScope.ADDRESS, address), (AuthScope.KEY_PREFIX, prefix)]
    return (ApiKey.objects.select_related("user")
            .annotate(locked=throttle.last_lock(idents, since=since, failures=failures),
                      **roles.role_annotations("user_id"))
            .filter(digest=digest).order_by("pk")[:1])


def key_lookup(*, digest: str, address: str, prefix: str, since, failures: int):
    """The user with the key of ``digest``, or None; on it ``awaken_locked``, the last
    failure of a lock on ``address`` or ``prefix`` (``throttle.lock_bounds``: ``since``,
    ``failures``), or None, and the role flags ``roles.remember_roles`` reads."""
    failure = AuthFailure._meta
    params = [AuthScope.ADDRESS, address, AuthScope.KEY_PREFIX, prefix,
              failure.get_field("failures").get_db_prep_value(failures, connection),
              failure.get_field("last_failed_at").get_db_prep_value(since, connection),
              *roles.ROLES, digest]
    found = rows(get_user_model(), _key_lookup_sql(), params,
                 extra=("awaken_locked", *(f"_awaken_has_{role}" for role in roles.ROLES)))
    if not found:
        return None
    user = found[0]
    # Only the model's columns are converted: SQLite gives the others as stored.
    locked = user.awaken_locked
    if locked is not None and not isinstance(locked, datetime.datetime):
        locked = failure.get_field("last_failed_at").to_python(locked)
    if locked is not None and timezone.is_naive(locked):
        locked = timezone.make_aware(locked, datetime.UTC)
    user.awaken_locked = locked
    for role in roles.ROLES:
        setattr(user, f"_awaken_has_{role}", bool(getattr(user, f"_awaken_has_{role}")))
    return user


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
        found = key_lookup(digest=key_digest(key), address=address[:64],
                           prefix=key[:PREFIX_LENGTH], **throttle.lock_bounds(now))
        if found is not None:
            wait = throttle.seconds_left(found.awaken_locked, now)
            if wait:
                raise TooManyFailures(wait)
            if found.is_active:
                roles.remember_roles(found, found)
                return found
    wait = throttle.locked_for(idents)
    if wait:
        raise TooManyFailures(wait)
    throttle.failure_record(idents)
    return None
