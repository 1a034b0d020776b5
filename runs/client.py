"""A typed Python client of awaken-site's REST API and event stream, sync and async.

    from runs.client import Client

    with Client("http://127.0.0.1:8000", token="...") as awaken:
        run = awaken.runs.create("demo.steps", input={"steps": 3})
        done = awaken.runs.wait(run["id"])          # on the event stream, not by polling
        print(done["end_cause"], done["output"])

``AsyncClient`` has the same calls, awaited (and ``async for`` over ``list`` and ``stream``).
Both share one implementation: each call is a plan of requests (``_Call``) that the client
sends with its own httpx client, and one parser of answers and of the event stream. It
depends on httpx alone: nothing of the server is imported.

Errors are ``ApiError`` subclasses carrying the API's ``code``; a server that cannot be
reached is ``Unreachable``. A create is sent with an ``Idempotency-Key`` (one is made when the
caller gives none) and retried on a lost connection or a 503, so that it makes one run at
most. ``runs.stream`` resumes after a disconnect from the last ``seq`` it gave, and skips
what it already gave: no gap, no duplicate.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypedDict

import httpx

__all__ = [
    "ApiError", "AsyncClient", "AuthenticationFailed", "Busy", "Client", "Conflict",
    "Event", "Invalid", "Message", "NotFound", "PermissionDenied", "Run", "Throttled",
    "Unreachable", "WaitTimeout",
]

SOURCE_HEADER = "X-Awaken-Source"
ENDED = "ended"
RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0)  # a create or a stream that lost its connection
RETRIED_STATUS = {502, 503, 504}


# --- shapes (the API's JSON, see API.md) ----------------------------------------------------


class Run(TypedDict, total=False):
    id: str
    agent: str
    input: Any
    thread_id: str
    parent_id: str | None
    state: str
    end_cause: str | None
    stop_code: str | None
    stop_reason: str | None
    error: str | None
    output: Any
    generation: int
    ticket: dict | None
    control: dict | None
    budget: dict
    usage: dict
    version: int
    created_at: str
    started_at: str | None
    ended_at: str | None
    updated_at: str


class Event(TypedDict, total=False):
    seq: int
    run_id: str
    kind: str
    state: str
    end_cause: str | None
    generation: int
    actor: str | None
    source: str | None
    data: dict
    at: str


class Message(TypedDict, total=False):
    """A message of the event stream: ``snapshot`` (``seq``, ``runs``) or ``run.changed``
    (``seq``, ``event``, ``run``)."""

    type: str
    seq: int
    runs: list[Run]
    event: Event
    run: Run


# --- errors ---------------------------------------------------------------------------------


class ClientError(Exception):
    """Anything this client raises."""


class Unreachable(ClientError):
    """The server could not be reached (or stopped answering)."""


class WaitTimeout(ClientError, TimeoutError):
    """``wait`` gave up before the run got where it was awaited."""


class ApiError(ClientError):
    """The server refused: its HTTP ``status``, the API's ``code`` and ``detail``, and the
    whole JSON ``body`` (a 409 ``not_active`` carries the committed ``run``)."""

    def __init__(self, status: int, code: str, detail: str, body: Any = None):
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail, self.body = status, code, detail, body


class Invalid(ApiError):
    """400: bad input (``invalid``, ``parse_error``)."""


class AuthenticationFailed(ApiError):
    """401: no or a wrong token."""


class PermissionDenied(ApiError):
    """403: the user's role does not allow it."""


class NotFound(ApiError):
    """404."""


class Conflict(ApiError):
    """409: ``not_active``, ``not_awaiting``, ``ticket_mismatch``, ``idempotency_conflict``…"""


class Throttled(ApiError):
    """429: too many failures; ``retry_after`` seconds."""

    retry_after: float | None = None


class Busy(ApiError):
    """503 ``busy``: the server could not even try; ``retry_after`` seconds."""

    retry_after: float | None = None


ERRORS = {400: Invalid, 401: AuthenticationFailed, 403: PermissionDenied, 404: NotFound,
          409: Conflict, 413: Invalid, 429: Throttled, 503: Busy}


def error_of(response: httpx.Response) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        code, detail = str(body.get("code", "error")), str(body.get("detail", ""))
    else:
        code, detail = "error", response.text[:500]
    error = ERRORS.get(response.status_code, ApiError)(response.status_code, code, detail, body)
    if isinstance(error, Throttled | Busy) and response.headers.get("Retry-After", "").isdigit():
        error.retry_after = float(response.headers["Retry-After"])
    return error


# --- one implementation of requests and answers ---------------------------------------------


@dataclass
class _Call:
    """One API call: what to send, and whether it may be sent again after a lost connection
    or a 503 (only what cannot take effect twice)."""

    method: str
    path: str
    params: dict | None = None
    json: Any = None
    headers: dict = field(default_factory=dict)
    retry: bool = False
    empty_ok: bool = False

    def answer(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise error_of(response)
        if self.empty_ok and not response.content:
            return None
        return response.json()


def _params(**values) -> dict:
    return {key: value for key, value in values.items() if value is not None}


def _runs_query(filters: dict) -> dict:
    query = {}
    for key, value in filters.items():
        if value is None:
            continue
        if isinstance(value, list | tuple | set):
            value = ",".join(value)
        query[key] = value
    return query


class _Plans:
    """The calls of the API, as ``_Call`` plans; no I/O."""

    @staticmethod
    def create(agent: str, *, input=None, thread_id=None, parent_id=None, budget=None,
               start_after=None, idempotency_key: str | None = None) -> _Call:
        body = {"agent": agent, **_params(input=input, thread_id=thread_id,
                                          parent_id=parent_id, budget=budget,
                                          start_after=start_after)}
        key = idempotency_key or str(uuid.uuid4())  # so a retried create makes one run
        return _Call("POST", "/api/runs/", json=body, headers={"Idempotency-Key": key},
                     retry=True)

    @staticmethod
    def control(run_id: str, action: str, *, wait: float | None, body: dict) -> _Call:
        return _Call("POST", f"/api/runs/{run_id}/{action}/", params=_params(wait=wait),
                     json=body)


class _SeqCursor:
    """Where a stream is: the highest ``seq`` given, and the seqs given lately, so that a
    replay after a reconnect (which may repeat a short window before the cursor, where a late
    commit of an earlier seq would be) gives nothing twice."""

    def __init__(self, after: int | None):
        self.after = after
        self._given: deque[int] = deque(maxlen=20_000)
        self._given_set: set[int] = set()

    def take(self, message: dict) -> bool:
        """Whether ``message`` is new (and, if so, it is counted as given)."""
        seq = message.get("seq")
        if message.get("type") == "snapshot":
            self.after = max(self.after or 0, seq or 0)
            return True
        if message.get("type") != "run.changed" or not isinstance(seq, int):
            return False  # live activity and job progress are not committed changes
        if seq in self._given_set:
            return False
        if len(self._given) == self._given.maxlen:
            self._given_set.discard(self._given[0])
        self._given.append(seq)
        self._given_set.add(seq)
        self.after = max(self.after or 0, seq)
        return True

    def headers(self) -> dict:
        return {"Last-Event-ID": str(self.after)} if self.after is not None else {}


class _EventParser:
    """The ``text/event-stream`` format, line by line: the JSON of each event's data."""

    def __init__(self):
        self._data: list[str] = []

    def feed(self, line: str) -> dict | None:
        if line == "":
            if not self._data:
                return None
            text, self._data = "\n".join(self._data), []
            return json.loads(text)
        if line.startswith("data:"):
            self._data.append(line[5:].removeprefix(" "))
        return None


def _stream_path(run_id: str | None) -> str:
    return "/api/runs/stream/" if run_id is None else f"/api/runs/{run_id}/stream/"


def _reached(until) -> Callable[[Run], bool]:
    if until is None:
        return lambda run: run.get("state") == ENDED
    if callable(until):
        return until
    states = {until} if isinstance(until, str) else set(until)
    return lambda run: run.get("state") in states or run.get("end_cause") in states


def _runs_of(message: dict) -> list[Run]:
    if message.get("type") == "snapshot":
        return message.get("runs", [])
    return [message["run"]] if "run" in message else []


def _headers(token: str | None, source: str | None) -> dict:
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    if source:
        headers[SOURCE_HEADER] = source
    return headers


UNREACHABLE = (httpx.TransportError,)


# --- sync -----------------------------------------------------------------------------------


class Client:
    """The sync client: ``Client(url, token=...)``; use it as a context manager or
    ``close()`` it. ``source="cli"`` records controls as the command line's."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0,
                 source: str | None = None, transport: httpx.BaseTransport | None = None):
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=_headers(token, source),
                                  timeout=timeout, follow_redirects=False,
                                  transport=transport)
        self.runs = Runs(self)
        self.bulk = Bulk(self)
        self.review_links = ReviewLinks(self)
        self.workers = Workers(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def call(self, plan: _Call) -> Any:
        for delay in (*RETRY_DELAYS, None):
            try:
                response = self._http.request(plan.method, plan.path, params=plan.params,
                                              json=plan.json, headers=plan.headers)
            except UNREACHABLE as error:
                if not plan.retry or delay is None:
                    raise Unreachable(f"{self.url}: {error}") from error
            else:
                if not (plan.retry and response.status_code in RETRIED_STATUS) or delay is None:
                    return plan.answer(response)
            time.sleep(delay)

    def pages(self, path: str, params: dict) -> Iterator[dict]:
        """The results of every page of a list, following ``next``."""
        url, query = path, params
        while url:
            page = self.call(_Call("GET", url, params=query))
            yield from page["results"]
            url, query = page.get("next"), None

    def messages(self, run_id: str | None, cursor: _SeqCursor, *,
                 timeout: float | None = None) -> Iterator[dict]:
        """The stream's new messages, reconnecting from the cursor whenever it drops."""
        deadline = None if timeout is None else time.monotonic() + timeout
        failures = 0
        while True:
            try:
                with self._http.stream("GET", _stream_path(run_id), headers=cursor.headers(),
                                       timeout=httpx.Timeout(30.0, read=60.0)) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise error_of(response)
                    parser = _EventParser()
                    for line in response.iter_lines():
                        failures = 0
                        message = parser.feed(line)
                        if message is not None and cursor.take(message):
                            yield message
                        if deadline is not None and time.monotonic() > deadline:
                            raise WaitTimeout("the stream did not bring it in time")
            except UNREACHABLE as error:
                failures += 1
                if failures > len(RETRY_DELAYS):
                    raise Unreachable(f"{self.url}: {error}") from error
                time.sleep(RETRY_DELAYS[failures - 1])
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout("the stream did not bring it in time")


class Runs:
    def __init__(self, client: Client):
        self._c = client

    def create(self, agent: str, *, input: Any = None, thread_id: str | None = None,
               parent_id: str | None = None, budget: dict | None = None,
               start_after: str | None = None, idempotency_key: str | None = None) -> Run:
        return self._c.call(_Plans.create(agent, input=input, thread_id=thread_id,
                                          parent_id=parent_id, budget=budget,
                                          start_after=start_after,
                                          idempotency_key=idempotency_key))

    def get(self, run_id: str) -> Run:
        return self._c.call(_Call("GET", f"/api/runs/{run_id}/"))

    def list(self, *, limit: int | None = None, page_size: int | None = None,
             **filters) -> Iterator[Run]:
        """Runs matching the filters (``state``, ``end_cause``, ``agent``, ``thread_id``,
        ``parent_id``, ``status``, ``q``, ``id_prefix``, ``error``, ``created_after``,
        ``created_before``, ``sort``), newest first, page after page; at most ``limit``."""
        query = _runs_query({**filters, "limit": page_size or min(limit or 100, 500)})
        for count, run in enumerate(self._c.pages("/api/runs/", query), 1):
            yield run
            if limit is not None and count >= limit:
                return

    def cancel(self, run_id: str, *, reason: str | None = None,
               wait: float | None = None) -> Run:
        return self._c.call(_Plans.control(run_id, "cancel", wait=wait,
                                           body=_params(reason=reason)))

    def stop(self, run_id: str, *, reason: str, wait: float | None = None) -> Run:
        return self._c.call(_Plans.control(run_id, "stop", wait=wait, body={"reason": reason}))

    def pause(self, run_id: str, *, wait: float | None = None) -> Run:
        return self._c.call(_Plans.control(run_id, "pause", wait=wait, body={}))

    def resume(self, run_id: str, *, ticket: str, input: Any = None) -> Run:
        return self._c.call(_Plans.control(run_id, "resume", wait=None,
                                           body={"ticket": ticket, **_params(input=input)}))

    def deliver(self, run_id: str, command: str, *, message: Any = None) -> dict:
        return self._c.call(_Plans.control(run_id, "deliver", wait=None, body={
            "command": command, **_params(message=message)}))

    def events(self, run_id: str, *, after: int = 0) -> Iterator[Event]:
        """The run's events in seq order, page after page."""
        while True:
            page = self._c.call(_Call("GET", f"/api/runs/{run_id}/events/",
                                      params={"after": after, "limit": 1000}))["results"]
            yield from page
            if len(page) < 1000:
                return
            after = page[-1]["seq"]

    def stream(self, run_id: str | None = None, *, after: int | None = None) -> Iterator[Message]:
        """The committed changes of one run (or of every run), live: first a snapshot
        (unless ``after`` is given), then each ``run.changed``; across disconnects, from
        the last seq given, without gaps or duplicates."""
        yield from self._c.messages(run_id, _SeqCursor(after))

    def wait(self, run_id: str, *, until=None, timeout: float | None = None) -> Run:
        """The run once ``until`` holds: a state or end cause (or several), a predicate of
        the run, or by default the run's end. Waits on the event stream."""
        reached = _reached(until)
        for message in self._c.messages(run_id, _SeqCursor(None), timeout=timeout):
            for run in _runs_of(message):
                if reached(run):
                    return run
        raise WaitTimeout("the stream ended")  # pragma: no cover (messages never ends)


class Bulk:
    def __init__(self, client: Client):
        self._c = client

    def preview(self, *, ids: list[str] | None = None, filter: dict | None = None) -> dict:
        return self._c.call(_Call("POST", "/api/bulk/preview/",
                                  json=_params(ids=ids, filter=filter)))

    def create(self, action: str, *, ids: list[str] | None = None, filter: dict | None = None,
               reason: str | None = None) -> dict:
        return self._c.call(_Call("POST", "/api/bulk/", json={
            "action": action, **_params(ids=ids, filter=filter, reason=reason)}))

    def get(self, job_id: str) -> dict:
        return self._c.call(_Call("GET", f"/api/bulk/{job_id}/"))

    def list(self) -> Iterator[dict]:
        return self._c.pages("/api/bulk/", {})

    def abort(self, job_id: str) -> dict:
        return self._c.call(_Call("POST", f"/api/bulk/{job_id}/abort/", json={}))


class ReviewLinks:
    def __init__(self, client: Client):
        self._c = client

    def create(self, run_id: str, *, expires_in: int | None = None) -> dict:
        return self._c.call(_Call("POST", f"/api/runs/{run_id}/review-links/",
                                  json=_params(expires_in=expires_in)))

    def list(self, run_id: str) -> dict:
        return self._c.call(_Call("GET", f"/api/runs/{run_id}/review-links/"))

    def revoke(self, run_id: str, link_id: str) -> dict:
        return self._c.call(_Call("POST", f"/api/runs/{run_id}/review-links/{link_id}/revoke/",
                                  json={}, empty_ok=True))


class Workers:
    def __init__(self, client: Client):
        self._c = client

    def list(self) -> list[dict]:
        return self._c.call(_Call("GET", "/api/workers/"))["results"]

    def drain(self, name: str) -> dict:
        return self._c.call(_Call("POST", f"/api/workers/{name}/drain/", json={}))

    def undrain(self, name: str) -> dict:
        return self._c.call(_Call("POST", f"/api/workers/{name}/undrain/", json={}))


# --- async ----------------------------------------------------------------------------------


class AsyncClient:
    """The async client: the same calls as ``Client``, awaited; ``async with`` it."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0,
                 source: str | None = None, transport: httpx.AsyncBaseTransport | None = None):
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.url, headers=_headers(token, source),
                                       timeout=timeout, follow_redirects=False,
                                       transport=transport)
        self.runs = AsyncRuns(self)
        self.bulk = AsyncBulk(self)
        self.review_links = AsyncReviewLinks(self)
        self.workers = AsyncWorkers(self)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def call(self, plan: _Call) -> Any:
        for delay in (*RETRY_DELAYS, None):
            try:
                response = await self._http.request(plan.method, plan.path, params=plan.params,
                                                    json=plan.json, headers=plan.headers)
            except UNREACHABLE as error:
                if not plan.retry or delay is None:
                    raise Unreachable(f"{self.url}: {error}") from error
            else:
                if not (plan.retry and response.status_code in RETRIED_STATUS) or delay is None:
                    return plan.answer(response)
            await asyncio.sleep(delay)

    async def pages(self, path: str, params: dict) -> AsyncIterator[dict]:
        url, query = path, params
        while url:
            page = await self.call(_Call("GET", url, params=query))
            for item in page["results"]:
                yield item
            url, query = page.get("next"), None

    async def messages(self, run_id: str | None, cursor: _SeqCursor, *,
                       timeout: float | None = None) -> AsyncIterator[dict]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        failures = 0
        while True:
            try:
                async with self._http.stream(
                        "GET", _stream_path(run_id), headers=cursor.headers(),
                        timeout=httpx.Timeout(30.0, read=60.0)) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise error_of(response)
                    parser = _EventParser()
                    async for line in response.aiter_lines():
                        failures = 0
                        message = parser.feed(line)
                        if message is not None and cursor.take(message):
                            yield message
                        if deadline is not None and loop.time() > deadline:
                            raise WaitTimeout("the stream did not bring it in time")
            except UNREACHABLE as error:
                failures += 1
                if failures > len(RETRY_DELAYS):
                    raise Unreachable(f"{self.url}: {error}") from error
                await asyncio.sleep(RETRY_DELAYS[failures - 1])
            if deadline is not None and loop.time() > deadline:
                raise WaitTimeout("the stream did not bring it in time")


class AsyncRuns:
    def __init__(self, client: AsyncClient):
        self._c = client

    async def create(self, agent: str, *, input: Any = None, thread_id: str | None = None,
                     parent_id: str | None = None, budget: dict | None = None,
                     start_after: str | None = None,
                     idempotency_key: str | None = None) -> Run:
        return await self._c.call(_Plans.create(agent, input=input, thread_id=thread_id,
                                                parent_id=parent_id, budget=budget,
                                                start_after=start_after,
                                                idempotency_key=idempotency_key))

    async def get(self, run_id: str) -> Run:
        return await self._c.call(_Call("GET", f"/api/runs/{run_id}/"))

    async def list(self, *, limit: int | None = None, page_size: int | None = None,
                   **filters) -> AsyncIterator[Run]:
        query = _runs_query({**filters, "limit": page_size or min(limit or 100, 500)})
        count = 0
        async for run in self._c.pages("/api/runs/", query):
            yield run
            count += 1
            if limit is not None and count >= limit:
                return

    async def cancel(self, run_id: str, *, reason: str | None = None,
                     wait: float | None = None) -> Run:
        return await self._c.call(_Plans.control(run_id, "cancel", wait=wait,
                                                 body=_params(reason=reason)))

    async def stop(self, run_id: str, *, reason: str, wait: float | None = None) -> Run:
        return await self._c.call(_Plans.control(run_id, "stop", wait=wait,
                                                 body={"reason": reason}))

    async def pause(self, run_id: str, *, wait: float | None = None) -> Run:
        return await self._c.call(_Plans.control(run_id, "pause", wait=wait, body={}))

    async def resume(self, run_id: str, *, ticket: str, input: Any = None) -> Run:
        return await self._c.call(_Plans.control(run_id, "resume", wait=None, body={
            "ticket": ticket, **_params(input=input)}))

    async def deliver(self, run_id: str, command: str, *, message: Any = None) -> dict:
        return await self._c.call(_Plans.control(run_id, "deliver", wait=None, body={
            "command": command, **_params(message=message)}))

    async def events(self, run_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        while True:
            page = (await self._c.call(_Call("GET", f"/api/runs/{run_id}/events/",
                                             params={"after": after, "limit": 1000})))["results"]
            for event in page:
                yield event
            if len(page) < 1000:
                return
            after = page[-1]["seq"]

    async def stream(self, run_id: str | None = None, *,
                     after: int | None = None) -> AsyncIterator[Message]:
        async for message in self._c.messages(run_id, _SeqCursor(after)):
            yield message

    async def wait(self, run_id: str, *, until=None, timeout: float | None = None) -> Run:
        reached = _reached(until)
        async for message in self._c.messages(run_id, _SeqCursor(None), timeout=timeout):
            for run in _runs_of(message):
                if reached(run):
                    return run
        raise WaitTimeout("the stream ended")  # pragma: no cover


class AsyncBulk:
    def __init__(self, client: AsyncClient):
        self._c = client

    async def preview(self, *, ids: list[str] | None = None,
                      filter: dict | None = None) -> dict:
        return await self._c.call(_Call("POST", "/api/bulk/preview/",
                                        json=_params(ids=ids, filter=filter)))

    async def create(self, action: str, *, ids: list[str] | None = None,
                     filter: dict | None = None, reason: str | None = None) -> dict:
        return await self._c.call(_Call("POST", "/api/bulk/", json={
            "action": action, **_params(ids=ids, filter=filter, reason=reason)}))

    async def get(self, job_id: str) -> dict:
        return await self._c.call(_Call("GET", f"/api/bulk/{job_id}/"))

    def list(self) -> AsyncIterator[dict]:
        return self._c.pages("/api/bulk/", {})

    async def abort(self, job_id: str) -> dict:
        return await self._c.call(_Call("POST", f"/api/bulk/{job_id}/abort/", json={}))


class AsyncReviewLinks:
    def __init__(self, client: AsyncClient):
        self._c = client

    async def create(self, run_id: str, *, expires_in: int | None = None) -> dict:
        return await self._c.call(_Call("POST", f"/api/runs/{run_id}/review-links/",
                                        json=_params(expires_in=expires_in)))

    async def list(self, run_id: str) -> dict:
        return await self._c.call(_Call("GET", f"/api/runs/{run_id}/review-links/"))

    async def revoke(self, run_id: str, link_id: str) -> dict:
        return await self._c.call(_Call(
            "POST", f"/api/runs/{run_id}/review-links/{link_id}/revoke/", json={},
            empty_ok=True))


class AsyncWorkers:
    def __init__(self, client: AsyncClient):
        self._c = client

    async def list(self) -> list[dict]:
        return (await self._c.call(_Call("GET", "/api/workers/")))["results"]

    async def drain(self, name: str) -> dict:
        return await self._c.call(_Call("POST", f"/api/workers/{name}/drain/", json={}))

    async def undrain(self, name: str) -> dict:
        return await self._c.call(_Call("POST", f"/api/workers/{name}/undrain/", json={}))
