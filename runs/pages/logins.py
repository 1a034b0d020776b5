"""The login throttle's settings and its page, for django-axes (see the AXES_* settings).

Axes counts failed logins per (username, address) pair in the database and refuses a
locked-out login before any password is hashed; this module tells it the limits, read
from the AWAKEN_AUTH_* settings when asked, and answers a refused login with a 429 page.
"""

from datetime import timedelta
from math import ceil

from axes.helpers import get_client_username
from axes.models import AccessAttempt
from django.conf import settings
from django.shortcuts import render
from django.utils import timezone


def failure_limit(request, credentials) -> int:
    return settings.AWAKEN_AUTH_FAILURES


def lockout_period(request) -> timedelta:
    # Axes counts an attempt while it is no older than this, bounds included: a microsecond
    # less ends a lockout exactly AWAKEN_AUTH_LOCKOUT_SECONDS after the last failure, when
    # Retry-After says, as the key throttle does.
    return timedelta(seconds=settings.AWAKEN_AUTH_LOCKOUT_SECONDS) - timedelta(microseconds=1)


def locked_out(request, response, credentials):
    """429 with Retry-After, as a page that says when to try again."""
    wait = seconds_until_unlocked(request.axes_ip_address,
                                  get_client_username(request, credentials))
    page = render(request, "registration/locked_out.html", {
        "failures": settings.AWAKEN_AUTH_FAILURES, "wait": _in_words(wait)}, status=429)
    page["Retry-After"] = str(wait)
    return page


def seconds_until_unlocked(address: str | None, username: str | None) -> int:
    """When the (username, address) pair is below the limit again.

    Axes forgets each attempt row a lockout period after its last failure, and locks while
    the fresh rows of the pair add up to the limit.
    """
    period, now = timedelta(seconds=settings.AWAKEN_AUTH_LOCKOUT_SECONDS), timezone.now()
    fresh = AccessAttempt.objects.filter(attempt_time__gt=now - period)
    ends = [now]
    for rows in (fresh.filter(ip_address=address, username=username),):
        attempts = list(rows.order_by("attempt_time").values_list("attempt_time",
                                                                  "failures_since_start"))
        remaining = sum(count for _, count in attempts)
        for at, count in attempts:
            if remaining < settings.AWAKEN_AUTH_FAILURES:
                break
            remaining -= count
            ends.append(at + period)
    return max(1, ceil((max(ends) - now).total_seconds()))


def _in_words(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} seconds"
    return f"{ceil(seconds / 60)} minutes"
