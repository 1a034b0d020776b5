"""A provider stub: a small ASGI app that speaks the OpenAI chat completions API.

The tests, ``manage.py bench`` and the offline demo use it (``make run`` starts one when no
provider is configured); ``manage.py provider_stub`` serves it alone. The model name chooses
what it does: a reply kind, then flags joined with ``+`` (``canned+pace=0.05``):

* ``echo`` (and any name it does not know) answers "You said: <the last user message>";
  ``canned`` answers with the stub's canned reply for that message, or its default one.
* Offered ``tools``, it first asks for each of them, with arguments made from the last user
  message; once their results are in, it answers and quotes them. With ``loop`` it asks
  for them again every time, with the same arguments: a model stuck in a loop.
* ``words=N`` repeats the answer to N words; ``bytes=N`` to N bytes, streamed 16 KiB to a
  chunk (a huge answer, quickly); ``pace=S`` waits S seconds between chunks.
* ``hang`` or ``hang=N``: after N chunks (1) it sends nothing more until its client goes, or
  until ``release()``, after which it sends the rest (a late chunk, if the client left). The
  flag may be given more than once: each hang waits for a release of its own.
* ``429``, ``500`` or any other status: the first try of each distinct request answers with
  it (``fail=N``: the first N tries), with ``Retry-After`` when ``retry-after=S`` is given.
  A 401 quotes the API key it was sent, as some providers do.

Streams send a word per chunk and, when asked (``stream_options.include_usage``), a last
chunk with the usage: the words of the prompt and of the answer. Every call is recorded in
``calls`` with its times (monotonic clock), so a test or the benchmark can see when its
client went away; the record keeps no text and no key.
"""

import asyncio
import hashlib
import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import uvicorn

DEFAULT_CANNED = (
    "This answer comes from the awaken-site provider stub. It streams word by word, like a "
    "real model, so the run page shows it as it arrives. Cancel the run while it streams and "
    "the stub sees its connection close at once; nothing of the partial answer is kept."
)
DEFAULT_CANNED_REPLIES = {
    "hello": "Hello! I am the provider stub of awaken-site, answering offline.",
    "hello!": "Hello! I am the provider stub of awaken-site, answering offline.",
}


PIECE_BYTES = 16 * 1024  # the text of one chunk, for bytes=N


@dataclass
class Call:
    """One request to the stub, as it saw it."""

    number: int
    model: str
    stream: bool
    authorized: bool  # an API key came with it (the key itself is not kept)
    started: float = field(default_factory=time.monotonic)
    status: int = 200
    first_chunk: float | None = None
    finished: float | None = None  # the stub handed the end of its answer on
    disconnected: float | None = None  # the client closed the connection before the end
    chunks: int = 0
    late_chunks: int = 0  # chunks the stub tried to send after its client had gone
    holding: bool = False  # hanging now, until its client goes or a release


@dataclass(frozen=True)
class Behaviour:
    reply: str = "echo"
    words: int | None = None
    size: int | None = None  # bytes=N
    pace: float | None = None
    hang_at: tuple[int, ...] = ()  # hang once this many chunks are sent
    fail_status: int | None = None
    fail_times: int = 1
    retry_after: str | None = None
    loop: bool = False  # ask for the tools again whatever their results

    @classmethod
    def of(cls, model: str) -> "Behaviour":
        kind, *flags = str(model).split("+")
        options: dict = {"reply": kind if kind in ("echo", "canned") else "echo"}
        for flag in flags:
            name, _, value = flag.partition("=")
            if name.isdigit():
                options["fail_status"] = int(name)
            elif name == "hang":
                options["hang_at"] = (*options.get("hang_at", ()), int(value or 1))
            elif name == "words":
                options["words"] = int(value)
            elif name == "bytes":
                options["size"] = int(value)
            elif name == "pace":
                options["pace"] = float(value)
            elif name == "fail":
                options["fail_times"] = int(value)
            elif name == "retry-after":
                options["retry_after"] = value
            elif name == "loop":
                options["loop"] = True
        return cls(**options)


class Stub:
    """The ASGI app. ``pace``: default seconds between chunks; ``canned``: replies by the
    last user message (lower case), with ``default`` for any other."""

    def __init__(self, *, pace: float = 0.0, canned: dict | None = None,
                 default: str = DEFAULT_CANNED):
        self.pace = pace
        self.canned = {**DEFAULT_CANNED_REPLIES, **(canned or {})}
        self.default = default
        self._calls: deque[Call] = deque(maxlen=10_000)
        self._numbers = iter(range(1, 1 << 62))
        self._tries: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._release: asyncio.Event | None = None

    # --- for tests and benchmarks, from any thread -------------------------------------------

    @property
    def calls(self) -> list[Call]:
        """The calls so far (the last 10,000), oldest first: a copy, safe from any thread."""
        return list(self._calls)

    def release(self) -> None:
        """Let every hanging answer go on (with late chunks)."""
        if self._loop is not None:
            # Both on the loop: a hang reached after this release must wait for the next.
            self._loop.call_soon_threadsafe(self._release_now)

    def _release_now(self) -> None:
        event, self._release = self._release, None
        if event is not None:
            event.set()

    def wait(self, condition, timeout: float = 10.0, what: str = "the stub"):
        """Poll ``condition(calls)`` until it returns something truthy, and return that."""
        deadline = time.monotonic() + timeout
        while True:
            found = condition(self.calls)
            if found:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.005)

    # --- ASGI ----------------------------------------------------------------------------------

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                pass
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"].rstrip("/"), scope["method"]
        if path.endswith("/chat/completions") and method == "POST":
            await self._chat(scope, receive, send)
        elif path.endswith("/models") and method == "GET":
            await _json(send, 200, {"object": "list", "data": [
                {"id": name, "object": "model", "owned_by": "stub"}
                for name in ("echo", "canned")]})
        else:
            await _error(send, 404, "not_found", f"No route {method} {scope['path']}.")

    async def _chat(self, scope, receive, send):
        raw = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            body = json.loads(raw)
            model, messages = body["model"], body["messages"]
            if not isinstance(model, str) or not isinstance(messages, list) or not messages:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            await _error(send, 400, "invalid_request",
                         "The body must be JSON with a model and a non-empty messages list.")
            return
        headers = dict(scope["headers"])
        key = headers.get(b"authorization", b"").decode().removeprefix("Bearer ").strip()
        behaviour = Behaviour.of(model)
        stream = bool(body.get("stream"))
        call = Call(next(self._numbers), model, stream, authorized=bool(key))
        self._calls.append(call)
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

        if behaviour.fail_status and self._try_number(raw) <= behaviour.fail_times:
            call.status = behaviour.fail_status
            extra = ({"retry-after": behaviour.retry_after} if behaviour.retry_after else {})
            detail = (f"Incorrect API key provided: {key}." if call.status == 401
                      else f"The stub answers {call.status} to this try on purpose.")
            await _error(send, call.status, "stub_failure", detail, extra)
            call.finished = time.monotonic()
            return

        gone = asyncio.Event()
        watcher = asyncio.create_task(self._watch(receive, call, gone))
        try:
            answer = self._answer(messages, body.get("tools") or [], behaviour)
            answer.model = model
            if stream:
                await self._stream(send, call, behaviour, answer, body, gone)
            else:
                await self._hang_if_asked(behaviour, 0, call, gone)
                if not gone.is_set():
                    call.finished = time.monotonic()  # before the answer, as above
                    await _json(send, 200, answer.completion(model))
        finally:
            watcher.cancel()

    def _try_number(self, raw: bytes) -> int:
        fingerprint = hashlib.sha256(raw).hexdigest()
        if len(self._tries) > 10_000:
            self._tries.clear()
        self._tries[fingerprint] = self._tries.get(fingerprint, 0) + 1
        return self._tries[fingerprint]

    async def _watch(self, receive, call: Call, gone: asyncio.Event) -> None:
        """Note the moment the client closes the connection."""
        while (await receive())["type"] != "http.disconnect":
            pass
        if call.finished is None:
            call.disconnected = time.monotonic()
        gone.set()

    async def _hang_if_asked(self, behaviour: Behaviour, sent: int, call: Call,
                             gone: asyncio.Event):
        if sent not in behaviour.hang_at or gone.is_set():
            return
        if self._release is None:
            self._release = asyncio.Event()
        released = asyncio.ensure_future(self._release.wait())
        went = asyncio.ensure_future(gone.wait())
        call.holding = True
        await asyncio.wait({released, went}, return_when=asyncio.FIRST_COMPLETED)
        call.holding = False
        released.cancel()
        went.cancel()

    async def _stream(self, send, call, behaviour, answer, body, gone):
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        pace = behaviour.pace if behaviour.pace is not None else self.pace
        pieces = answer.pieces()
        for index, delta in enumerate(pieces):
            await self._hang_if_asked(behaviour, index, call, gone)
            if index and pace and not gone.is_set():
                await asyncio.sleep(pace)
            await self._event(send, call, answer.chunk(delta, None))
            await asyncio.sleep(0)  # the watcher's turn: a client gone is seen at once
            if gone.is_set():
                return  # that chunk went nowhere; a real provider stops generating too
            if call.first_chunk is None:
                call.first_chunk = time.monotonic()
        await self._hang_if_asked(behaviour, len(pieces), call, gone)
        await self._event(send, call, answer.chunk({}, answer.finish_reason))
        if (body.get("stream_options") or {}).get("include_usage"):
            await self._event(send, call, {**answer.chunk({}, None), "choices": [],
                                           "usage": answer.usage()})
        # Marked before the last bytes go: a client that has them may close at once, and
        # its disconnect is then no answer cut short.
        if call.disconnected is None:
            call.finished = time.monotonic()
        await self._send(send, call, b"data: [DONE]\n\n", more=False)

    async def _event(self, send, call: Call, chunk: dict) -> None:
        await self._send(send, call, b"data: " + json.dumps(chunk).encode() + b"\n\n")

    async def _send(self, send, call: Call, data: bytes, more: bool = True) -> None:
        if call.disconnected is not None:
            call.late_chunks += 1  # the server drops it: nobody is there to read it
        else:
            call.chunks += 1
        await send({"type": "http.response.body", "body": data, "more_body": more})

    def _answer(self, messages: list, tools: list, behaviour: Behaviour) -> "_Answer":
        last_user = next((i for i in range(len(messages) - 1, -1, -1)
                          if isinstance(messages[i], dict) and messages[i].get("role") == "user"),
                         None)
        prompt = _text(messages[last_user].get("content")) if last_user is not None else ""
        results = [_text(m.get("content")) for m in messages[(last_user or 0) + 1:]
                   if isinstance(m, dict) and m.get("role") == "tool"]
        prompt_tokens = sum(len(_text(m.get("content")).split()) for m in messages
                            if isinstance(m, dict))
        if tools and (not results or behaviour.loop):
            calls = [_tool_call(tool, prompt, index) for index, tool in enumerate(tools)]
            return _Answer("", calls, prompt_tokens)
        if behaviour.reply == "canned":
            text = self.canned.get(prompt.strip().lower(), self.default)
        else:
            text = f"You said: {prompt}"
        if results:
            text += " From the tools: " + " | ".join(result[:300] for result in results)
        if behaviour.words:
            words = text.split()
            text = " ".join(words[i % len(words)] for i in range(behaviour.words))
        if behaviour.size:
            text = (text + " ") * (behaviour.size // (len(text) + 1) + 1)
            return _Answer(text[:behaviour.size], [], prompt_tokens, piece_size=PIECE_BYTES)
        return _Answer(text, [], prompt_tokens)


class _Answer:
    """What the stub says to one request, in either shape (streamed or whole)."""

    def __init__(self, text: str, tool_calls: list[dict], prompt_tokens: int, *,
                 piece_size: int | None = None):
        self.text = text
        self.piece_size = piece_size
        self.tool_calls = tool_calls
        self.prompt_tokens = prompt_tokens
        self.finish_reason = "tool_calls" if tool_calls else "stop"
        self.id = f"chatcmpl-stub-{time.monotonic_ns()}"
        self.model = ""

    def usage(self) -> dict:
        completion = len(self.text.split()) + sum(
            1 + len(call["function"]["arguments"].split()) for call in self.tool_calls)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}

    def pieces(self) -> list[dict]:
        """The deltas of a stream: a word of text each, or a tool call in two halves."""
        if self.tool_calls:
            pieces = []
            for index, call in enumerate(self.tool_calls):
                arguments = call["function"]["arguments"]
                half = len(arguments) // 2
                pieces.append({"tool_calls": [{"index": index, "id": call["id"],
                                               "type": "function", "function": {
                                                   "name": call["function"]["name"],
                                                   "arguments": arguments[:half]}}]})
                pieces.append({"tool_calls": [{"index": index, "function": {
                    "arguments": arguments[half:]}}]})
            return pieces
        if self.piece_size:
            return [{"content": self.text[i:i + self.piece_size]}
                    for i in range(0, len(self.text), self.piece_size)]
        words = self.text.split(" ")
        return [{"content": word + (" " if i < len(words) - 1 else "")}
                for i, word in enumerate(words)]

    def chunk(self, delta: dict, finish_reason: str | None) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.model, "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    def completion(self, model: str) -> dict:
        message: dict = {"role": "assistant", "content": self.text or None}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return {"id": self.id, "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [
                    {"index": 0, "message": message, "finish_reason": self.finish_reason}],
                "usage": self.usage()}


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else json.dumps(content)


def _tool_call(tool: dict, prompt: str, index: int) -> dict:
    """A call of ``tool`` whose required arguments are made from the user's message."""
    function = (tool or {}).get("function") or {}
    schema = function.get("parameters") or {}
    properties = schema.get("properties") or {}
    samples = {"string": prompt, "integer": 3, "number": 3, "boolean": True, "array": [],
               "object": {}}
    arguments = {name: samples.get((properties.get(name) or {}).get("type"), prompt)
                 for name in schema.get("required") or ()}
    return {"id": f"call_{time.monotonic_ns()}_{index}", "type": "function",
            "function": {"name": function.get("name", ""), "arguments": json.dumps(arguments)}}


async def _json(send, status: int, data: dict, headers: dict | None = None) -> None:
    body = json.dumps(data).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *((name.encode(), value.encode()) for name, value in (headers or {}).items())]})
    await send({"type": "http.response.body", "body": body})


async def _error(send, status: int, code: str, message: str, headers=None) -> None:
    await _json(send, status, {"error": {"message": message, "type": code, "code": code}},
                headers)


class StubServer:
    """A stub served by uvicorn on 127.0.0.1, in a thread with its own event loop.

    ``port`` 0 takes a free one; ``url`` is the base URL to configure. Use it as a context
    manager, or call ``start()`` and ``stop()``.
    """

    def __init__(self, stub: Stub | None = None, *, host: str = "127.0.0.1", port: int = 0):
        self.stub = stub or Stub()
        self.host = host
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.port = self._socket.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(
            self.stub, lifespan="off", log_level="warning", access_log=False,
            timeout_graceful_shutdown=1))
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]},
                                        name="provider-stub", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout: float = 10.0) -> "StubServer":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the provider stub did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(5)
        self._socket.close()

    def __enter__(self) -> "StubServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
