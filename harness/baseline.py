"""A plain Celery task for the cancel benchmark's baseline (loaded only by its worker, with
``-I harness.baseline``)."""

import time

import redis
from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings


@shared_task(name="harness.bench_hang", ignore_result=True)
def bench_hang(key: str) -> None:
    """Hang until revoked with terminate=True (SIGUSR1), then record when that was seen."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.set(f"{key}:started", time.time())
    try:
        while True:
            time.sleep(0.001)
    except SoftTimeLimitExceeded:
        client.set(f"{key}:stopped", time.time())
