"""Webhooks: operators' endpoints, and the deliveries owed to them.

A delivery is a row written in the transaction of the change it tells of (a run ended or
awaiting, a bulk job done), so a crash of the web or the worker loses none. Sending is not
done here: ``runs.workers.webhooks`` claims the deliveries that are due, sends them and
reports each attempt back (``attempt_recorded``). A delivery is retried with backoff until a
2xx answers or ``AWAKEN_WEBHOOK_RETRY_SECONDS`` have passed since it was written; its id
(the ``webhook-id`` header) is the same on every attempt.
"""

import base64
import json
import secrets
import uuid
from datetime import timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runs.domain import sql
from runs.domain.errors import InvalidRequest, ServiceError
from runs.models import (
    DeliveryState,
    MetricDelta,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)

SECRET_PREFIX = "whsec_"
# The /metrics total of failed attempts (MetricDelta name), keyed ``retry`` (tried again
# later) or ``gave_up`` (the delivery is failed).
WEBHOOK_FAILURES = "webhook_failures"
BACKOFF = (5, 30, 120, 300, 900, 1800, 3600)  # seconds before attempt 2, 3, ...; then hourly


class WebhookNotFound(ServiceError):
    code = "not_found"
    status = 404


def host_allowed(host: str | None) -> bool:
    """Whether ``host`` is one of ``AWAKEN_WEBHOOK_ALLOWED_HOSTS`` (``.example.com`` also
    allows its subdomains). Nothing else is ever called."""
    if not host:
        return False
    host = host.lower().rstrip(".")
    for allowed in settings.AWAKEN_WEBHOOK_ALLOWED_HOSTS:
        allowed = allowed.lower()
        if host == allowed.lstrip(".") or (allowed.startswith(".") and host.endswith(allowed)):
            return True
    return False


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest("A webhook URL is http:// or https:// with a host.")
    if parts.username or parts.password:
        raise InvalidRequest("A webhook URL carries no credentials.")
    if not host_allowed(parts.hostname):
        raise InvalidRequest(f"{parts.hostname} is not in AWAKEN_WEBHOOK_ALLOWED_HOSTS.")
    return url


def check_secret(secret: str | None) -> str:
    if secret is None:
        return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except ValueError:
        key = b""
    if not secret.startswith(SECRET_PREFIX) or not 24 <= len(key) <= 64:
        raise InvalidRequest("A secret is whsec_ and the base64 of 24 to 64 bytes.")
    return secret


def endpoint_create(*, url: str, events: list[str], secret: str | None,
                    created_by) -> WebhookEndpoint:
    if not events or not set(events) <= set(WebhookEvent.values) or len(set(events)) != len(
            events):
        raise InvalidRequest(f"events is a list of distinct types of {WebhookEvent.values}.")
    return WebhookEndpoint.objects.create(url=check_url(url), events=list(events),
                                          secret=check_secret(secret), created_by=created_by)


def _pk(value) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise WebhookNotFound("No such webhook endpoint or delivery.") from None


def endpoint_get(endpoint_id) -> WebhookEndpoint:
    try:
        return WebhookEndpoint.objects.get(pk=_pk(endpoint_id))
    except WebhookEndpoint.DoesNotExist:
        raise WebhookNotFound("No such webhook endpoint.") from None


def deliveries_of(endpoint: WebhookEndpoint, *, limit: int = 100) -> list[WebhookDelivery]:
    return list(endpoint.deliveries.order_by("-created_at")[:limit])


def redeliver(*, endpoint: WebhookEndpoint, delivery_id) -> WebhookDelivery:
    """Send a delivery again, now, whatever became of it (same ``webhook-id``)."""
    with transaction.atomic():
        try:
            delivery = endpoint.deliveries.select_for_update().get(pk=_pk(delivery_id))
        except WebhookDelivery.DoesNotExist:
            raise WebhookNotFound("No such delivery.") from None
        delivery.state = DeliveryState.PENDING
        delivery.next_attempt_at = timezone.now()
        delivery.save(update_fields=["state", "next_attempt_at"])
    return delivery


def enqueue(kind: str, data, *, any_active: bool | None = None) -> None:
    """Owe every active endpoint that asked for ``kind`` a delivery of ``data()``: rows
    written in the caller's transaction. With no active endpoint (the usual case) this is
    one small read, and ``data`` is never made; ``any_active``: whether there is one, when
    the caller has read it already (``ANY_ACTIVE``)."""
    if any_active is None:
        any_active = sql.exists(WebhookEndpoint, active=True)
    if not any_active:
        return
    endpoints = [e for e in WebhookEndpoint.objects.filter(active=True) if kind in e.events]
    if not endpoints:
        return
    now = timezone.now()
    body = json.dumps({"type": kind, "timestamp": now.isoformat(), "data": data()},
                      separators=(",", ":"))
    WebhookDelivery.objects.bulk_create([
        WebhookDelivery(endpoint=endpoint, type=kind, body=body, created_at=now,
                        next_attempt_at=now) for endpoint in endpoints])


# Whether any endpoint is active: read by the statement of a run's transition that
# webhooks tell of (``runs.domain.core``), not by a statement of its own. Not a cache: an
# endpoint made or activated in any process is seen by the next transition that starts
# after it commits.
ANY_ACTIVE = sql.Exists(WebhookEndpoint, {"active": True})


def told_of(run, kind: str) -> str | None:
    """The webhook event a run's transition tells of (``kind``, the run as changed), if
    it is one."""
    from runs.models import EventKind, RunState

    if kind == EventKind.ENDED:
        return WebhookEvent.RUN_ENDED
    if run.state == RunState.AWAITING and kind == EventKind.PAUSED:
        return WebhookEvent.RUN_AWAITING
    return None


def run_changed(run, kind: str) -> None:
    """The webhook of a run's transition, if it is one webhooks tell of; called once the
    transition's statement has read that an endpoint is active (``ANY_ACTIVE``)."""
    from runs.domain.representation import run_data

    event = told_of(run, kind)
    if event is not None:
        enqueue(event, lambda: run_data(run), any_active=True)


def claim_due(*, limit: int = 50, lease_seconds: float) -> list[WebhookDelivery]:
    """Deliveries due now, each claimed for ``lease_seconds`` (no other sender takes it
    meanwhile; a sender that dies leaves it due again once the lease is over)."""
    now = timezone.now()
    with transaction.atomic():
        due = list(WebhookDelivery.objects.select_for_update(skip_locked=True)
                   .select_related("endpoint")
                   .filter(state=DeliveryState.PENDING, next_attempt_at__lte=now)
                   .order_by("next_attempt_at")[:limit])
        WebhookDelivery.objects.filter(pk__in=[d.pk for d in due]).update(
            next_attempt_at=now + timedelta(seconds=lease_seconds))
    return due


def attempt_recorded(*, delivery_id, status: int | None, error: str = "") -> WebhookDelivery:
    """One attempt's outcome: delivered on a 2xx; else due again after the backoff, or
    failed once retried for ``AWAKEN_WEBHOOK_RETRY_SECONDS``."""
    now = timezone.now()
    with transaction.atomic():
        delivery = WebhookDelivery.objects.select_for_update().get(pk=delivery_id)
        delivery.attempts += 1
        delivery.last_status = status
        delivery.last_error = error[:500]
        if status is not None and 200 <= status < 300:
            delivery.state = DeliveryState.DELIVERED
            delivery.delivered_at = now
        else:
            wait = BACKOFF[min(delivery.attempts - 1, len(BACKOFF) - 1)]
            delivery.next_attempt_at = now + timedelta(seconds=wait)
            if (delivery.next_attempt_at - delivery.created_at).total_seconds() > \
                    settings.AWAKEN_WEBHOOK_RETRY_SECONDS:
                delivery.state = DeliveryState.FAILED
            # Counted for /metrics (runs.domain.totals) in the same transaction.
            MetricDelta.objects.create(
                name=WEBHOOK_FAILURES, value=1,
                key="gave_up" if delivery.state == DeliveryState.FAILED else "retry")
        delivery.save()
    return delivery
