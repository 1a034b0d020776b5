"""Webhooks: registration (operators, allowed hosts only), a delivery row written in the
transaction of the change, Standard Webhooks signatures, retries with the same webhook-id,
the delivery log and a redeliver; sent to a local receiver over real HTTP."""

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone
from standardwebhooks import Webhook

from runs import domain
from runs.models import WebhookDelivery
from runs.workers.webhooks import send_due
from tests.factories import queued_run, running_run

pytestmark = pytest.mark.django_db(transaction=True)


class Receiver:
    """A local HTTP server that answers each POST with the next status of ``statuses``."""

    def __init__(self, statuses):
        self.statuses = list(statuses)
        self.received = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append((dict(self.headers.items()), body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                if status in (301, 302, 307):
                    self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings):
    settings.AWAKEN_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    made = []

    def make(*statuses):
        made.append(Receiver(statuses))
        return made[-1]

    yield make
    for one in made:
        one.close()


def register(client, url, events=("run.ended",)):
    answer = client.post("/api/webhooks/", {"url": url, "events": list(events)}, format="json")
    assert answer.status_code == 201, answer.json()
    return answer.json()


def due_now():
    WebhookDelivery.objects.update(next_attempt_at=timezone.now())


def test_registration_is_for_operators_and_allowed_hosts_only(op_client, viewer_client,
                                                              settings, receiver):
    settings.AWAKEN_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com", ".partner.example"]
    for url in ("http://10.0.0.1/x", "http://169.254.169.254/latest", "ftp://hooks.example.com/",
                "http://evil.example.com/", "http://user:pw@hooks.example.com/"):
        answer = op_client.post("/api/webhooks/", {"url": url, "events": ["run.ended"]},
                                format="json")
        assert (answer.status_code, answer.json()["code"]) == (400, "invalid"), url
    answer = op_client.post("/api/webhooks/", {"url": "https://hooks.example.com/x",
                                               "events": ["run.ended", "nope"]}, format="json")
    assert answer.status_code == 400
    assert viewer_client.post("/api/webhooks/", {"url": "https://hooks.example.com/x",
                                                 "events": ["run.ended"]},
                              format="json").status_code == 403
    made = register(op_client, "https://a.partner.example/hook", ["run.ended", "bulk.done"])
    assert made["secret"].startswith("whsec_")
    listed = op_client.get("/api/webhooks/").json()["results"]
    assert [e["id"] for e in listed] == [made["id"]] and "secret" not in listed[0]


def test_a_run_that_ends_is_delivered_signed_and_retried_with_the_same_id(op_client, receiver):
    target = receiver(500, 200)
    endpoint = register(op_client, target.url, ["run.ended"])
    run = queued_run()
    assert WebhookDelivery.objects.count() == 0  # created: not an event webhooks tell of
    domain.run_cancel(run_id=run.id, reason="done with it", actor="olga", source="api")
    delivery = WebhookDelivery.objects.get()  # written with the ending, before any send

    assert send_due() == 1  # the receiver answers 500
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("pending", 1, 500)
    assert timedelta(0) < delivery.next_attempt_at - timezone.now() <= timedelta(seconds=30)
    assert send_due() == 0  # not due yet
    due_now()
    assert send_due() == 1
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts) == ("delivered", 2)

    (first_headers, first_body), (headers, body) = target.received
    assert first_headers["webhook-id"] == headers["webhook-id"] == f"msg_{delivery.id.hex}"
    assert first_body == body
    Webhook(endpoint["secret"]).verify(body, {key.lower(): value for key, value in
                                              headers.items()})
    sent = json.loads(body)
    assert sent["type"] == "run.ended" and sent["data"]["id"] == str(run.id)
    assert sent["data"]["end_cause"] == "cancelled"

    log = op_client.get(f"/api/webhooks/{endpoint['id']}/deliveries/").json()["results"]
    assert [(d["id"], d["state"], d["attempts"]) for d in log] == [
        (headers["webhook-id"], "delivered", 2)]
    again = op_client.post(f"/api/webhooks/{endpoint['id']}/deliveries/"
                           f"{delivery.id}/redeliver/")
    assert again.status_code == 200 and again.json()["state"] == "pending"
    assert send_due() == 1 and len(target.received) == 3
    assert target.received[2][0]["webhook-id"] == headers["webhook-id"]


def test_redirects_are_not_followed_and_a_dead_endpoint_delays_no_other(op_client, receiver,
                                                                        settings):
    moved, good = receiver(302), receiver()
    register(op_client, moved.url)
    register(op_client, good.url)
    register(op_client, "http://127.0.0.1:9/dead")  # nothing listens there
    domain.run_cancel(run_id=queued_run().id, reason=None, actor="olga", source="api")
    assert send_due() == 3
    states = dict(WebhookDelivery.objects.values_list("endpoint__url", "state"))
    assert states[good.url] == "delivered" and len(good.received) == 1
    assert states[moved.url] == "pending" and len(moved.received) == 1  # 302: not followed
    assert states["http://127.0.0.1:9/dead"] == "pending"
    dead = WebhookDelivery.objects.get(endpoint__url="http://127.0.0.1:9/dead")
    assert dead.last_status is None and dead.last_error

    # A host taken off the list is never called again, whatever is owed to it.
    settings.AWAKEN_WEBHOOK_ALLOWED_HOSTS = []
    due_now()
    send_due()
    assert len(moved.received) == 1
    assert "ALLOWED_HOSTS" in WebhookDelivery.objects.get(endpoint__url=moved.url).last_error


def test_a_delivery_fails_once_retried_for_the_whole_window(op_client, receiver, settings):
    target = receiver(*[503] * 50)
    register(op_client, target.url)
    domain.run_cancel(run_id=queued_run().id, reason=None, actor="olga", source="api")
    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.update(created_at=timezone.now() - timedelta(
        seconds=settings.AWAKEN_WEBHOOK_RETRY_SECONDS))
    send_due()
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("failed", 1, 503)


def test_a_bulk_job_done_is_told_to_who_asked_for_it(op_client, operator, receiver):
    target = receiver()
    register(op_client, target.url, ["bulk.done"])
    run = queued_run()
    job = domain.bulk_create(action="cancel", reason=None, requested_by="olga",
                             created_by=operator, source="api", ids=[run.id])
    while domain.bulk_job_run(job_id=job.id):
        pass
    delivery = WebhookDelivery.objects.get()
    assert delivery.type == "bulk.done"  # and no run.ended: this endpoint did not ask
    send_due()
    sent = json.loads(target.received[0][1])
    assert (sent["type"], sent["data"]["id"], sent["data"]["state"]) == (
        "bulk.done", str(job.id), "done")


def test_a_run_that_awaits_someone_is_told(op_client, receiver):
    target = receiver()
    register(op_client, target.url, ["run.awaiting"])
    run, generation = running_run()
    domain.attempt_pause(run_id=run.id, generation=generation, reason="approval")
    delivery = WebhookDelivery.objects.get()
    assert delivery.type == "run.awaiting"
    send_due()
    sent = json.loads(target.received[0][1])
    assert sent["data"]["state"] == "awaiting" and sent["data"]["ticket"]["reason"] == "approval"
