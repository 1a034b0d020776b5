"""/metrics for Prometheus: names that follow its conventions, a scrape that needs a key or
an allowed address unless a setting makes it public, the webhook failures counted, and the
Grafana dashboard of docs/ querying only what /metrics serves."""

import ipaddress
import json
import re
from pathlib import Path

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from runs.domain import webhooks
from runs.models import WebhookDelivery
from tests.conftest import api_key_for, make_user
from tests.factories import queued_run

ROOT = Path(__file__).resolve().parent.parent
ELSEWHERE = "203.0.113.9"  # a client address outside the default allowed ones (loopback)

pytestmark = pytest.mark.django_db


def scrape(**headers) -> str:
    response = Client().get("/metrics", **headers)
    assert response.status_code == 200, response.content
    return response.content.decode()


def families() -> dict[str, str]:
    """Each family /metrics serves: name -> type."""
    return {family.name: family.type for family in text_string_to_metric_families(scrape())}


def served_names() -> set[str]:
    """Every sample name /metrics may serve, whether or not it has a sample now (a histogram
    with nothing observed has only its HELP and TYPE lines)."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                "gauge": [""]}
    return {name + suffix for name, kind in families().items()
            for suffix in suffixes.get(kind, [""])}


def test_every_metric_follows_the_prometheus_naming_conventions():
    queued_run()
    found = families()
    assert found, "nothing served"
    for name, kind in found.items():
        if name.startswith(("python_", "process_")):  # prometheus_client's own
            continue
        assert name.startswith("awaken_"), name
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), name
        if kind == "histogram":
            assert name.endswith("_seconds"), name  # base unit, named
        assert not re.search(r"_(ms|milliseconds|minutes|hours|bytes_total)$", name), name
    text = scrape()
    for family in text_string_to_metric_families(text):
        if family.type == "counter":
            assert {sample.name for sample in family.samples} <= {
                family.name + "_total", family.name + "_created"}, family.name
    assert "awaken_webhook_delivery_failures" in found


def test_a_scrape_from_elsewhere_needs_an_api_key(settings):
    elsewhere = Client(REMOTE_ADDR=ELSEWHERE)
    refused = elsewhere.get("/metrics")
    assert refused.status_code == 401
    assert refused.json()["code"] == "not_authenticated"
    assert "awaken_runs" not in refused.content.decode()

    viewer = make_user("vera", "viewer")
    answered = elsewhere.get("/metrics", HTTP_AUTHORIZATION=f"Token {api_key_for(viewer)}")
    assert answered.status_code == 200 and "awaken_runs" in answered.content.decode()
    assert answered["Content-Type"].startswith("text/plain")

    nobody = make_user("nora")  # a key, but no role
    assert elsewhere.get("/metrics", HTTP_AUTHORIZATION=f"Token {api_key_for(nobody)}"
                         ).status_code == 403
    assert elsewhere.get("/metrics", HTTP_AUTHORIZATION="Token nope").status_code == 401
    session = Client(REMOTE_ADDR=ELSEWHERE)
    session.force_login(viewer)
    assert session.get("/metrics").status_code == 200


def test_an_allowed_address_or_the_public_setting_needs_no_key(settings):
    assert Client().get("/metrics").status_code == 200  # this host, allowed by default
    assert Client(REMOTE_ADDR="::1").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="::ffff:127.0.0.1").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="").get("/metrics").status_code == 401
    assert Client(REMOTE_ADDR=ELSEWHERE).get("/metrics").status_code == 401
    settings.AWAKEN_METRICS_ALLOWED_ADDRESSES = [ipaddress.ip_network("203.0.113.0/24")]
    assert Client(REMOTE_ADDR=ELSEWHERE).get("/metrics").status_code == 200
    assert Client().get("/metrics").status_code == 401  # loopback is no longer listed
    settings.AWAKEN_METRICS_ALLOWED_ADDRESSES = []
    settings.AWAKEN_METRICS_PUBLIC = True
    assert Client(REMOTE_ADDR=ELSEWHERE).get("/metrics").status_code == 200
    # Public: a bad key is not even checked.
    assert Client(REMOTE_ADDR=ELSEWHERE).get(
        "/metrics", HTTP_AUTHORIZATION="Token nope").status_code == 200


def test_the_allowed_addresses_setting_refuses_what_is_not_an_address():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "SECRET_KEY": "x",
             "DJANGO_SETTINGS_MODULE": "awaken_site.settings",
             "AWAKEN_METRICS_ALLOWED_ADDRESSES": "10.0.0.0/8,not-an-address"},
        capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "AWAKEN_METRICS_ALLOWED_ADDRESSES must list addresses or CIDR ranges" in done.stderr


def failures(text: str) -> dict[str, float]:
    return {sample.labels["result"]: sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "awaken_webhook_delivery_failures"
            for sample in family.samples if sample.name.endswith("_total")}


def test_webhook_attempts_that_fail_are_counted_until_the_delivery_gives_up(settings):
    settings.AWAKEN_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]
    endpoint = webhooks.endpoint_create(url="https://hooks.example.com/in", events=["run.ended"],
                                        secret=None, created_by=make_user("olga", "operator"))
    webhooks.enqueue("run.ended", lambda: {"id": "r"})
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    webhooks.attempt_recorded(delivery_id=delivery.pk, status=500, error="HTTP 500")
    webhooks.attempt_recorded(delivery_id=delivery.pk, status=None, error="timed out")
    assert failures(scrape()) == {"retry": 2, "gave_up": 0}
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        created_at=delivery.created_at.replace(year=delivery.created_at.year - 1))
    assert webhooks.attempt_recorded(delivery_id=delivery.pk, status=503).state == "failed"
    webhooks.attempt_recorded(delivery_id=delivery.pk, status=200)  # redelivered, answered
    assert failures(scrape()) == {"retry": 2, "gave_up": 1}


def test_the_grafana_dashboard_queries_only_what_metrics_serves():
    dashboard = json.loads((ROOT / "docs/grafana-dashboard.json").read_text())
    assert dashboard["title"] and dashboard["panels"] and dashboard["schemaVersion"] >= 36
    queried = set()
    for panel in dashboard["panels"]:
        assert panel["title"] and panel["targets"], panel
        for target in panel["targets"]:
            names = re.findall(r"\bawaken_[a-z0-9_]+", target["expr"])
            assert names, target["expr"]
            queried |= set(names)
    served = served_names()
    assert queried - served == set(), "the dashboard queries what /metrics does not serve"
    # It charts what the overview shows: runs by state and end cause, time to stop by
    # path, the stop receipts and webhook delivery failures.
    assert {"awaken_runs", "awaken_time_to_stop_seconds_bucket", "awaken_stop_receipts_total",
            "awaken_webhook_delivery_failures_total"} <= queried
    quantiles = [target["expr"] for panel in dashboard["panels"]
                 for target in panel["targets"] if "histogram_quantile" in target["expr"]]
    assert quantiles and all("by (le, path)" in expr for expr in quantiles)
