"""A client for OpenAI-compatible chat completions, on httpx.

A call is one ``POST {base_url}/chat/completions``, streamed (server-sent events) or not,
tried again with backoff on 429, 5xx, a timeout or a dropped connection. One client holds a
pool of connections and is used from one event loop (a worker's executor has one).

Cancellation belongs to the caller: the runtime races each call against the attempt's
token and cancels the task that runs it. A cancelled call closes its connection at once
(httpx never returns a half-read response to the pool), so the provider stops generating;
a retry waiting out its backoff is cancelled the same way.

The API key and the base URL belong to the deployment: they go to the provider and nowhere
else. Error messages are scrubbed of both before they can reach an event or a log.
"""

import asyncio
import json
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from runs.domain.text import clipped
from runs.providers.metering import metered_transport

ERROR_BODY_BYTES = 64 * 1024  # what is read of a refusal's body, for its message


class ProviderError(Exception):
    """The provider refused the call, or kept failing past the retries. Names no secret."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None,
                 retries_exhausted: bool = False):
        super().__init__(message)
        self.status = status
        self.code = code
        # True: every try failed in a way worth another (429, 5xx, a timeout, a dropped
        # connection); the provider may be back later. False: it refused the call itself.
        self.retries_exhausted = retries_exhausted


class ReplyTooLarge(ProviderError):
    """The reply went past AWAKEN_MAX_REPLY_BYTES: reading stopped there and the connection
    was closed (so the provider stops generating, and charging). Not tried again."""


class ProviderNotConfigured(ProviderError):
    """No base URL, or no model: see AWAKEN_PROVIDER_BASE_URL and AWAKEN_PROVIDER_MODEL."""


class _Retryable(Exception):
    """One try failed in a way that is worth another."""

    def __init__(self, message: str, *, status: int | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


@dataclass(frozen=True)
class ProviderConfig:
    base_url: str
    api_key: str = field(default="", repr=False)
    model: str = ""
    timeout: float = 120.0  # seconds one try may take, first byte to last chunk
    max_retries: int = 3
    max_reply_bytes: int = 1024 * 1024  # what is read of one reply at most

    @classmethod
    def from_settings(cls) -> "ProviderConfig":
        return cls(base_url=settings.AWAKEN_PROVIDER_BASE_URL,
                   api_key=settings.AWAKEN_PROVIDER_API_KEY,
                   model=settings.AWAKEN_PROVIDER_MODEL,
                   timeout=settings.AWAKEN_PROVIDER_TIMEOUT,
                   max_retries=settings.AWAKEN_PROVIDER_MAX_RETRIES,
                   max_reply_bytes=settings.AWAKEN_MAX_REPLY_BYTES)


@dataclass(frozen=True)
class Usage:
    """The provider's own count of the tokens of one call."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @classmethod
    def of(cls, data: dict) -> "Usage":
        prompt = int(data.get("prompt_tokens") or 0)
        completion = int(data.get("completion_tokens") or 0)
        return cls(prompt, completion, int(data.get("total_tokens") or prompt + completion))


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it

    def parsed(self) -> dict:
        """The arguments as a dict; ValueError if the model wrote something else."""
        value = json.loads(self.arguments or "{}")
        if not isinstance(value, dict):
            raise ValueError("tool arguments must be a JSON object")
        return value


@dataclass(frozen=True)
class Reply:
    """One answer of the model: its text, the tools it asks for, and what it cost."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None
    finish_reason: str | None = None
    model: str = ""
    tries: int = 1
    seconds: float = 0.0

    @property
    def tokens(self) -> int:
        return self.usage.total_tokens if self.usage else 0

    @property
    def message(self) -> dict:
        """The assistant message to append to the conversation."""
        message: dict = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["content"] = self.content or None
            message["tool_calls"] = [
                {"id": call.id, "type": "function",
                 "function": {"name": call.name, "arguments": call.arguments}}
                for call in self.tool_calls]
        return message


def tool_spec(tool) -> dict:
    """A tool as the API takes it: a ``Tool`` (its ``spec()``) or a spec dict as is."""
    if hasattr(tool, "spec"):
        return tool.spec()
    if isinstance(tool, dict):
        return tool
    raise TypeError(f"a tool is a Tool or a spec dict, not {type(tool).__name__}")


class ChatClient:
    BACKOFF_FIRST = 0.5  # seconds before the first retry; doubled for each next, with jitter
    BACKOFF_MAX = 20.0
    RETRY_AFTER_MAX = 60.0  # a provider's Retry-After is honoured up to this

    def __init__(self, config: ProviderConfig, *, max_connections: int | None = None,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.config = config
        parts = urlsplit(config.base_url)
        secrets = {config.api_key, config.base_url, config.base_url.rstrip("/"), parts.netloc}
        self._secrets = sorted((s for s in secrets if s), key=len, reverse=True)
        self._limits = httpx.Limits(max_connections=max_connections,
                                    max_keepalive_connections=20)
        self._transport = transport
        self._http: httpx.AsyncClient | None = None
        self._openai = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            headers = {"Accept": "application/json, text/event-stream"}
            if self.config.api_key:
                headers["Authorization"] = f"Bearer {self.config.api_key}"
            transport = self._transport or metered_transport(httpx, limits=self._limits)
            self._http = httpx.AsyncClient(base_url=self.config.base_url, headers=headers,
                                           limits=self._limits, transport=transport)
        return self._http

    # What openai_client and its first chat completion import (the SDK loads its resources
    # when first named): a framework adapter imports them ahead of its first run
    # (runs.agents.wrapping.FrameworkAgent.prepare).
    OPENAI_SDK = ("httpx2", "httpcore2", "openai", "openai.lib.streaming.chat",
                  "openai.resources.chat.completions:AsyncCompletions",
                  "openai.resources.chat.completions:AsyncMessages")

    def openai_client(self):
        """The OpenAI SDK's ``AsyncOpenAI`` on the configured provider, for the agent
        frameworks (``runs.agents.*``): its HTTP goes through a metered transport (httpx2,
        which the SDK uses), so the runtime sees and closes its connections as it does
        this client's. Retries are the SDK's (AWAKEN_PROVIDER_MAX_RETRIES), and so is the
        timeout of each try. Needs the ``frameworks`` extra (the SDK comes with it)."""
        if self._openai is None:
            import httpx2
            import openai

            if not self.config.base_url:
                raise ProviderNotConfigured("No model provider is configured: set "
                                            "AWAKEN_PROVIDER_BASE_URL.")
            limits = httpx2.Limits(max_connections=self._limits.max_connections,
                                   max_keepalive_connections=20)
            http = httpx2.AsyncClient(transport=metered_transport(httpx2, limits=limits),
                                      timeout=httpx2.Timeout(self.config.timeout,
                                                             connect=min(self.config.timeout,
                                                                         10.0)))
            self._openai = openai.AsyncOpenAI(
                base_url=self.config.base_url, api_key=self.config.api_key or "unused",
                http_client=http, max_retries=self.config.max_retries)
        return self._openai

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._openai is not None:
            await self._openai.close()
            self._openai = None

    def redact(self, text: str) -> str:
        """``text`` without the API key or the provider's address."""
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        return text

    async def chat(self, messages: Iterable[dict], *, model: str | None = None,
                   tools: Iterable | None = None, stream: bool = True,
                   timeout: float | None = None,
                   on_delta: Callable[[str], None] | None = None,
                   on_retry: Callable[[int, float], None] | None = None, **params) -> Reply:
        """One chat completion, tried again on 429, 5xx, timeouts and dropped connections.

        ``timeout`` (default AWAKEN_PROVIDER_TIMEOUT) bounds each try, first byte to last
        chunk. ``on_delta`` gets each piece of text as it streams in; ``on_retry`` (the try
        that failed, the backoff) is called before a retry, whose text starts over.
        Other keyword arguments (``temperature``, ``max_tokens``...) go into the request.
        """
        model = model or self.config.model
        if not self.config.base_url:
            raise ProviderNotConfigured("No model provider is configured: set "
                                        "AWAKEN_PROVIDER_BASE_URL.")
        if not model:
            raise ProviderNotConfigured("No model named: pass model= or set "
                                        "AWAKEN_PROVIDER_MODEL.")
        body = {**params, "model": model, "messages": list(messages), "stream": stream}
        if tools:
            body["tools"] = [tool_spec(tool) for tool in tools]
        if stream:
            body["stream_options"] = {"include_usage": True}
        limit = timeout or self.config.timeout
        started = time.monotonic()
        tries = 0
        while True:
            tries += 1
            try:
                async with asyncio.timeout(limit):
                    if stream:
                        reply = await self._stream(body, limit, on_delta)
                    else:
                        reply = await self._complete(body, limit)
                return replace(reply, tries=tries, seconds=time.monotonic() - started)
            except (TimeoutError, httpx.TimeoutException):
                failure = _Retryable(f"no answer within {limit:g} s")
            except httpx.TransportError as error:
                failure = _Retryable(f"the connection failed ({type(error).__name__}: "
                                     f"{error})")
            except _Retryable as error:
                failure = error
            if tries > self.config.max_retries:
                raise ProviderError(self.redact(f"The provider failed {tries} time(s); the "
                                                f"last: {failure}"), status=failure.status,
                                    retries_exhausted=True)
            delay = self.backoff(tries, failure.retry_after)
            if on_retry is not None:
                on_retry(tries, delay)
            await asyncio.sleep(delay)  # cancelled with the call: the backoff races the token

    def backoff(self, tries: int, retry_after: float | None) -> float:
        """Seconds to wait after failed try number ``tries``: the provider's Retry-After if
        it gave one, else an exponential backoff with jitter."""
        if retry_after is not None:
            return max(0.0, min(retry_after, self.RETRY_AFTER_MAX))
        ceiling = min(self.BACKOFF_MAX, self.BACKOFF_FIRST * 2 ** (tries - 1))
        return random.uniform(ceiling / 2, ceiling)

    # --- one try ------------------------------------------------------------------------------

    def _timeouts(self, limit: float) -> httpx.Timeout:
        return httpx.Timeout(limit, connect=min(limit, 10.0))

    async def _stream(self, body: dict, limit: float, on_delta) -> Reply:
        async with self._client().stream("POST", "chat/completions", json=body,
                                         timeout=self._timeouts(limit)) as response:
            if response.status_code != 200:
                await self._refuse(response)
            assembly = _Assembly(on_delta, model=body["model"])
            rest = b""
            async for piece in self._bounded(response):
                *lines, rest = (rest + piece).split(b"\n")
                for line in lines:
                    if assembly.feed(line.decode("utf-8", "replace").rstrip("\r")):
                        return assembly.reply()
            if rest:
                assembly.feed(rest.decode("utf-8", "replace"))
            return assembly.reply()

    async def _complete(self, body: dict, limit: float) -> Reply:
        async with self._client().stream("POST", "chat/completions", json=body,
                                         timeout=self._timeouts(limit)) as response:
            if response.status_code != 200:
                await self._refuse(response)
            raw = b"".join([piece async for piece in self._bounded(response)])
        try:
            data = json.loads(raw)
            choice = data["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise _Retryable("the provider's answer is not a chat completion") from None
        calls = tuple(ToolCall(call.get("id") or "", call["function"]["name"],
                               call["function"].get("arguments") or "")
                      for call in message.get("tool_calls") or ())
        return Reply(content=message.get("content") or "", tool_calls=calls,
                     usage=Usage.of(data["usage"]) if data.get("usage") else None,
                     finish_reason=choice.get("finish_reason"),
                     model=data.get("model") or body["model"])

    async def _bounded(self, response: httpx.Response):
        """The body's bytes as they come, up to ``max_reply_bytes``: past that, ReplyTooLarge
        (leaving the ``stream`` block closes the connection, half read)."""
        cap = self.config.max_reply_bytes
        received = 0
        async for piece in response.aiter_bytes():
            received += len(piece)
            if received > cap:
                raise ReplyTooLarge(f"The model's reply is larger than {cap} bytes "
                                    "(AWAKEN_MAX_REPLY_BYTES): it was cut there and the "
                                    "provider's connection closed.", code="reply_too_large")
            yield piece

    async def _refuse(self, response: httpx.Response):
        """Raise for an answer other than 200: retryable for 408, 429 and 5xx."""
        raw = b""
        async for piece in response.aiter_bytes():
            raw += piece
            if len(raw) >= ERROR_BODY_BYTES:
                break
        message, code = _error_of(raw)
        status = response.status_code
        text = self.redact(f"{status}{f' {code}' if code else ''}: {message}")
        if status in (408, 429) or status >= 500:
            raise _Retryable(text, status=status, retry_after=_retry_after(response.headers))
        raise ProviderError(f"The provider refused the call ({text})", status=status, code=code)


class _Assembly:
    """A streamed answer put back together from its server-sent events."""

    def __init__(self, on_delta, *, model: str):
        self.on_delta = on_delta
        self.model = model
        self.parts: list[str] = []
        self.calls: dict[int, dict] = {}
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.done = False

    def feed(self, line: str) -> bool:
        """Take one line of the stream; True at its end (``data: [DONE]``)."""
        if not line.startswith("data:"):
            return False
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return True
        try:
            chunk = json.loads(data)
        except ValueError:
            raise _Retryable("the provider sent a chunk that is not JSON") from None
        if chunk.get("error"):
            message, _ = _error_of(json.dumps(chunk).encode())
            raise _Retryable(f"the stream failed: {message}")
        self.model = chunk.get("model") or self.model
        if chunk.get("usage"):
            self.usage = Usage.of(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # one answer per call: n > 1 is not asked for
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                self.parts.append(text)
                if self.on_delta is not None:
                    self.on_delta(text)
            for piece in delta.get("tool_calls") or ():
                call = self.calls.setdefault(piece.get("index", 0),
                                             {"id": "", "name": "", "arguments": []})
                function = piece.get("function") or {}
                call["id"] = piece.get("id") or call["id"]
                call["name"] = function.get("name") or call["name"]
                call["arguments"].append(function.get("arguments") or "")
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return False

    def reply(self) -> Reply:
        if not self.done and self.finish is None:
            raise _Retryable("the stream ended before its last chunk")
        calls = tuple(ToolCall(call["id"], call["name"], "".join(call["arguments"]))
                      for _, call in sorted(self.calls.items()))
        return Reply(content="".join(self.parts), tool_calls=calls, usage=self.usage,
                     finish_reason=self.finish, model=self.model)


def _error_of(raw: bytes) -> tuple[str, str | None]:
    """The message and code of an error body (``{"error": {"message", "code"}}``)."""
    try:
        error = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        return clipped(str(error.get("message") or "no message"), 500), str(code) if code else None
    if isinstance(error, str):
        return clipped(error, 500), None
    return clipped(raw.decode("utf-8", "replace"), 200) or "no message", None


def _retry_after(headers: httpx.Headers) -> float | None:
    """Seconds the provider asks to wait: ``retry-after-ms``, or ``Retry-After`` in seconds
    or as an HTTP date; None if it says nothing readable."""
    try:
        if "retry-after-ms" in headers:
            return float(headers["retry-after-ms"]) / 1000
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            return parsedate_to_datetime(value).timestamp() - time.time()
    except (ValueError, TypeError):
        return None
