"""Failed API-key checks (keys no user has), counted per client address.

The rule is django-axes' rule for logins: after ``AWAKEN_AUTH_FAILURES`` failures, each less
than ``AWAKEN_AUTH_LOCKOUT_SECONDS`` after the one before, the address is locked until that
long after its last failure. A lock refuses only further unknown keys from the address: a
right key is let in before the lock is read (``runs.domain.keys.user_for_api_key``). The
counts are rows of ``AuthFailure``, so they hold across web processes, on SQLite and
PostgreSQL alike. A check refused while locked is not counted: a flood of them costs one
indexed read each and writes nothing.
"""

import operator
from datetime import timedelta
from functools import reduce
from math import ceil

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Case, F, Max, Q, Value, When
from django.utils import timezone

from runs.models import AuthFailure, AuthScope

Ident = tuple[AuthScope, str]


def _period() -> timedelta:
    return timedelta(seconds=settings.AWAKEN_AUTH_LOCKOUT_SECONDS)


def _matching(idents: list[Ident]) -> Q:
    return reduce(operator.or_, (Q(scope=scope, ident=ident) for scope, ident in idents))


def lock_bounds(now) -> dict:
    """What makes a count a lock at ``now``: at least ``failures`` failures, the last one
    after ``since``."""
    return {"since": now - _period(), "failures": settings.AWAKEN_AUTH_FAILURES}


def _locks(idents: list[Ident], *, since, failures):
    return AuthFailure.objects.filter(_matching(idents), failures__gte=failures,
                                      last_failed_at__gt=since)


def locked_for(idents: list[Ident]) -> int:
    """Whole seconds until none of ``idents`` is locked any more; 0 when none is."""
    now = timezone.now()
    return seconds_left(_locks(idents, **lock_bounds(now)).aggregate(
        last=Max("last_failed_at"))["last"], now)


def seconds_left(last_failed_at, now) -> int:
    if last_failed_at is None:
        return 0
    return max(0, ceil((last_failed_at + _period() - now).total_seconds()))


def failure_record(idents: list[Ident]) -> None:
    """Count one failure for each of ``idents``.

    1. Delete the counts idle for a lockout period: they have expired.
    2. Add one to the row of each ident (or start it again at one, if it expired since), or
       insert it. Two checks failing at once for a new ident both insert; the loser of the
       unique constraint adds to the winner's row. Each row is written in a statement of
       its own, so no two checks wait on each other for long.
    """
    now = timezone.now()
    expired = now - _period()
    AuthFailure.objects.filter(last_failed_at__lte=expired).delete()
    for scope, ident in idents:
        if _add_one(scope, ident, now, expired):
            continue
        try:
            with transaction.atomic():
                AuthFailure.objects.create(scope=scope, ident=ident, failures=1,
                                           last_failed_at=now)
        except IntegrityError:
            _add_one(scope, ident, now, expired)


def _add_one(scope: AuthScope, ident: str, now, expired) -> bool:
    return bool(AuthFailure.objects.filter(scope=scope, ident=ident).update(
        failures=Case(When(last_failed_at__lte=expired, then=Value(1)),
                      default=F("failures") + 1),
        last_failed_at=now))
