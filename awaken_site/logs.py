"""What every process writes to its log, made safe to read in a terminal.

* A record's message has every character that does not print (controls, bidi overrides,
  line separators) written as its escape (``\\n``, ``\\x1b``, ``\\u202e``): a
  run's error or an agent's text that holds a newline or an ANSI sequence can neither forge
  a log line nor act on the terminal of whoever tails the log. A traceback keeps its lines,
  each escaped and indented, so that only a record's own first line starts a line.
* Review-link tokens are secrets in a URL: any path of a review link is written with its
  token replaced by ``…``, whichever logger wrote it (the access log, Django's warnings).
"""

import logging
import re

REVIEW_TOKEN = re.compile(r"(/review/)[^/\s?#\"']+")


def escaped(text: str) -> str:
    """``text`` on one line, each character that does not print written as its escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def redacted(text: str) -> str:
    """``text`` with the token of every review-link path in it replaced by ``…``."""
    return REVIEW_TOKEN.sub(r"\1…", text)


class SafeFormatter(logging.Formatter):
    """The formatter of every handler the settings configure."""

    def formatMessage(self, record):  # noqa: N802 (logging's name)
        return redacted(escaped(super().formatMessage(record)))

    def formatException(self, ei):  # noqa: N802
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info):  # noqa: N802
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("  " + redacted(escaped(line)) for line in text.splitlines())


class AccessLog:
    """ASGI middleware for HTTP: one line per answered request on the ``awaken.access``
    logger (client, method, path with review tokens redacted, status, bytes), through the
    safe formatter. It stands in for daphne's own access log, which writes paths whole and
    is turned off (``-v 0``) wherever the web is started."""

    log = logging.getLogger("awaken.access")

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        answer = {"status": 0, "size": 0}

        async def sending(message):
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
            elif message["type"] == "http.response.body":
                answer["size"] += len(message.get("body", b""))
            await send(message)

        try:
            return await self.app(scope, receive, sending)
        finally:
            client = (scope.get("client") or ["-"])[0]
            self.log.info('%s "%s %s" %s %s', client, scope.get("method", "-"),
                          redacted(scope.get("path", "")), answer["status"] or "-",
                          answer["size"])
