"""The typed client (runs.client) against the embedded site: real daphne, worker and database.
Network faults are made by a transport that passes each request on to the real server and
then loses the connection, as a network would."""

import asyncio
import uuid

import httpx
import pytest

from runs.client import (
    AsyncClient,
    AuthenticationFailed,
    Client,
    Conflict,
    Invalid,
    NotFound,
    Unreachable,
)


class LosesAnswers(httpx.HTTPTransport):
    """Sends the first ``count`` requests to ``path`` to the server, then loses each answer
    (the server did the work; the client never hears of it)."""

    def __init__(self, path: str, count: int = 1):
        super().__init__()
        self.path, self.left = path, count

    def handle_request(self, request):
        response = super().handle_request(request)
        if request.url.path == self.path and self.left > 0:
            self.left -= 1
            response.read()
            response.close()
            raise httpx.ReadError("connection lost", request=request)
        return response


class DropsStreams(httpx.HTTPTransport):
    """Cuts each event stream after ``lines`` lines, ``count`` times."""

    def __init__(self, lines: int, count: int):
        super().__init__()
        self.lines, self.left = lines, count

    def handle_request(self, request):
        response = super().handle_request(request)
        if not request.url.path.endswith("/stream/") or self.left <= 0:
            return response
        self.left -= 1
        lines = self.lines

        class Cut(httpx.SyncByteStream):
            def __iter__(self):
                given = 0
                for chunk in response.stream:
                    for piece in chunk.splitlines(keepends=True):
                        yield piece
                        given += 1
                        if given >= lines:
                            response.close()
                            raise httpx.ReadError("connection lost", request=request)

            def close(self):
                response.close()

        return httpx.Response(response.status_code, headers=response.headers, stream=Cut(),
                              request=request)


@pytest.fixture
def awaken(embedded_site):
    with Client(embedded_site.base, token=embedded_site.token) as client:
        yield client


def test_create_wait_get_events_and_list(awaken):
    thread = f"client-{uuid.uuid4()}"
    runs = [awaken.runs.create("demo.steps", input={"steps": 2, "step_seconds": 0.05},
                               thread_id=thread) for _ in range(3)]
    assert all(run["state"] == "queued" for run in runs)
    done = awaken.runs.wait(runs[0]["id"], timeout=20)
    assert (done["state"], done["end_cause"]) == ("ended", "completed")
    assert awaken.runs.get(runs[0]["id"]) == done | {"updated_at": done["updated_at"]}
    kinds = [event["kind"] for event in awaken.runs.events(runs[0]["id"])]
    assert kinds[0] == "created" and kinds[-1] == "ended" and kinds.count("step") == 2
    for run in runs[1:]:
        awaken.runs.wait(run["id"], until="completed", timeout=20)

    # Every page, one run a page: the filters go to the server, the pages are followed.
    listed = list(awaken.runs.list(thread_id=thread, page_size=1))
    assert [run["id"] for run in listed] == [run["id"] for run in reversed(runs)]
    assert len(list(awaken.runs.list(thread_id=thread, page_size=1, limit=2))) == 2
    assert list(awaken.runs.list(thread_id=thread, state="queued")) == []


def test_errors_are_typed_and_carry_the_apis_code(awaken, embedded_site):
    with pytest.raises(NotFound) as missing:
        awaken.runs.get(str(uuid.uuid4()))
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    with pytest.raises(Invalid) as invalid:
        awaken.runs.create("no.such.agent")
    assert invalid.value.code == "invalid"
    run = awaken.runs.create("demo.steps", input={"steps": 1, "step_seconds": 0.01})
    awaken.runs.wait(run["id"], timeout=20)
    with pytest.raises(Conflict) as conflict:
        awaken.runs.resume(run["id"], ticket=str(uuid.uuid4()))
    assert conflict.value.code == "not_awaiting"
    with Client(embedded_site.base, token="wrong") as stranger, \
            pytest.raises(AuthenticationFailed) as refused:
        stranger.runs.get(run["id"])
    assert refused.value.code == "authentication_failed"
    with Client("http://127.0.0.1:9", token="x") as nowhere, pytest.raises(Unreachable):
        nowhere.runs.get(run["id"])


def test_a_create_whose_answer_is_lost_is_retried_and_makes_one_run(embedded_site):
    thread = f"retried-{uuid.uuid4()}"
    transport = LosesAnswers("/api/runs/", count=2)
    with Client(embedded_site.base, token=embedded_site.token, transport=transport) as client:
        run = client.runs.create("demo.steps", input={"steps": 1}, thread_id=thread)
        assert transport.left == 0  # two answers were lost, the third one came
        assert [r["id"] for r in client.runs.list(thread_id=thread)] == [run["id"]]
        again = client.runs.create("demo.steps", input={"steps": 2}, thread_id=thread,
                                   idempotency_key="k-" + thread)
        with pytest.raises(Conflict) as conflict:  # the same key, another run asked for
            client.runs.create("demo.steps", input={"steps": 3}, thread_id=thread,
                               idempotency_key="k-" + thread)
        assert conflict.value.code == "idempotency_conflict"
        assert again["id"] != run["id"]


def test_the_stream_resumes_after_each_disconnect_without_gaps_or_duplicates(embedded_site):
    with Client(embedded_site.base, token=embedded_site.token) as plain:
        run = plain.runs.create("demo.steps", input={"steps": 4, "step_seconds": 0.3})
        transport = DropsStreams(lines=7, count=4)  # some events each time, then cut
        with Client(embedded_site.base, token=embedded_site.token,
                    transport=transport) as client:
            seqs = []
            for message in client.runs.stream(run["id"]):
                if message["type"] == "run.changed":
                    seqs.append(message["seq"])
                    # (a replayed change carries its run as committed now: ended, maybe)
                    if message["event"]["kind"] == "ended":
                        break
        assert transport.left == 0  # it was cut four times
        committed = [event["seq"] for event in plain.runs.events(run["id"])]
        first = seqs[0] if seqs else None
        assert seqs == sorted(set(seqs))
        # After the snapshot, every event once, in order (those before it are in it).
        assert seqs == [seq for seq in committed if first is not None and seq >= first]


def test_controls_from_the_command_line_record_source_cli(embedded_site):
    with Client(embedded_site.base, token=embedded_site.token, source="cli") as cli:
        run = cli.runs.create("demo.hang")
        cli.runs.wait(run["id"], until="running", timeout=20)
        ended = cli.runs.stop(run["id"], reason="from the shell", wait=10)
        assert ended["end_cause"] == "stopped" and ended["control"]["source"] == "cli"
        assert [e["source"] for e in cli.runs.events(run["id"])][0] == "cli"


def test_bulk_jobs_and_review_links(awaken):
    later = "2999-01-01T00:00:00+00:00"
    thread = f"bulk-{uuid.uuid4()}"
    ids = [awaken.runs.create("demo.steps", thread_id=thread, start_after=later)["id"]
           for _ in range(2)]
    assert awaken.bulk.preview(filter={"thread_id": thread}) == {"total": 2, "live": 2}
    job = awaken.bulk.create("cancel", filter={"thread_id": thread}, reason="tidy")
    assert job["state"] in ("queued", "running", "done")
    for run_id in ids:
        assert awaken.runs.wait(run_id, timeout=20)["end_cause"] == "cancelled"

    run = awaken.runs.create("demo.approval", input={"steps_before": 0, "step_seconds": 0.01})
    awaiting = awaken.runs.wait(run["id"], until="awaiting", timeout=20)
    link = awaken.review_links.create(run["id"], expires_in=600)
    assert link["url"].startswith("/review/") or "/review/" in link["url"]
    resumed = awaken.runs.resume(run["id"], ticket=awaiting["ticket"]["id"],
                                 input={"approved": True})
    assert resumed["state"] != "awaiting"
    assert awaken.runs.wait(run["id"], timeout=20)["end_cause"] == "completed"


def test_the_async_client_does_the_same_on_one_implementation(embedded_site):
    async def scenario():
        async with AsyncClient(embedded_site.base, token=embedded_site.token) as awaken:
            thread = f"async-{uuid.uuid4()}"
            run = await awaken.runs.create("demo.steps", input={"steps": 1}, thread_id=thread)
            done = await awaken.runs.wait(run["id"], timeout=20)
            listed = [r["id"] async for r in awaken.runs.list(thread_id=thread)]
            kinds = [e["kind"] async for e in awaken.runs.events(run["id"])]
            with pytest.raises(NotFound):
                await awaken.runs.get(str(uuid.uuid4()))
            return done, listed, kinds, run

    done, listed, kinds, run = asyncio.run(scenario())
    assert done["end_cause"] == "completed" and listed == [run["id"]]
    assert kinds[-1] == "ended"
