"""Sending webhooks: the deliveries that are due, each signed (Standard Webhooks, the
``standardwebhooks`` package) and posted to its endpoint on a thread of its own, so that a
slow or dead endpoint holds up no other. Redirects are not followed, and a URL whose host is
not in ``AWAKEN_WEBHOOK_ALLOWED_HOSTS`` now is not called. Run by the beat task
``runs.webhooks`` (and by ``manage.py serve``'s own loop); nothing a request waits on."""

import logging
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from standardwebhooks import Webhook

from runs.domain import webhooks

log = logging.getLogger(__name__)

THREADS = 8


def headers_for(delivery, *, now: datetime) -> dict:
    msg_id = f"msg_{delivery.id.hex}"
    signature = Webhook(delivery.endpoint.secret).sign(msg_id, now, delivery.body)
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signature, "content-type": "application/json",
            "user-agent": "awaken-site-webhooks"}


def post(delivery) -> tuple[int | None, str]:
    """One attempt: the answer's status (None without one) and what went wrong, if anything.
    On a thread of its own; touches no database."""
    if not webhooks.host_allowed(urlsplit(delivery.endpoint.url).hostname):
        return None, "the host is not in AWAKEN_WEBHOOK_ALLOWED_HOSTS"
    try:
        response = httpx.post(delivery.endpoint.url, content=delivery.body.encode(),
                              headers=headers_for(delivery, now=datetime.now(UTC)),
                              timeout=settings.AWAKEN_WEBHOOK_TIMEOUT, follow_redirects=False)
    except httpx.HTTPError as problem:
        return None, f"{type(problem).__name__}: {problem}"
    status = response.status_code
    return status, "" if 200 <= status < 300 else f"HTTP {status}"


def send_due(*, limit: int = 50) -> int:
    """Send the deliveries due now, each on a thread of its own, and record each attempt as
    soon as it is over; how many were tried."""
    due = webhooks.claim_due(limit=limit,
                             lease_seconds=settings.AWAKEN_WEBHOOK_TIMEOUT * 2 + 5)
    if not due:
        return 0
    with ThreadPoolExecutor(min(THREADS, len(due)), thread_name_prefix="webhook") as pool:
        attempts = {pool.submit(post, delivery): delivery for delivery in due}
        for attempt in as_completed(attempts):
            delivery = attempts[attempt]
            try:
                status, error = attempt.result()
            except Exception as problem:  # a bug here must not lose the others' outcome
                log.exception("a webhook delivery could not be sent")
                status, error = None, f"{type(problem).__name__}"
            webhooks.attempt_recorded(delivery_id=delivery.id, status=status, error=error)
    return len(due)
