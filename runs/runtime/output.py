"""Live output: the text of a streaming model call, pushed to its run's page as it arrives.

It is not a committed change. A ``run.output`` message carries no seq, no version and no
run; nothing stores it and a lost one is not replayed. The page shows it apart from the
committed state and drops it once the step that produced it commits (the step's event
holds the final message) or the run ends. Pushes are throttled per attempt (one attempt per
run at a time): text that arrives in between goes with the next push, and the end of a
call's text goes at once, before its step can commit. Once the attempt's token is
cancelled, nothing more is pushed, and whatever waits is dropped.
"""

import asyncio
import codecs
import json

# The text of one push at most, in characters: encoded as JSON (6 bytes for a character at
# worst), well under the 1 MiB of a websocket message. More text goes in several pushes.
PUSH_CHARS = 32 * 1024


# Looked up here, at import, so that a worker's first count does not load the codec on its
# loop.
codecs.lookup("utf-16-le")


def utf16_length(text: str) -> int:
    """The length of ``text`` as a browser counts it, for offsets the page can use."""
    return len(text.encode("utf-16-le")) // 2


class LiveOutput:
    """The live output of one attempt: one ``OutputStream`` per model call.

    ``publish(run_id, text)`` sends an encoded message; ``per_second`` caps the pushes (0
    turns live output off).
    """

    def __init__(self, *, run_id, generation: int, token, publish, per_second: float):
        self.run_id = str(run_id)
        self.generation = generation
        self.token = token
        self.publish = publish
        self.interval = 1 / per_second if per_second > 0 else None
        self.calls = 0
        self._dirty: list[OutputStream] = []
        self._last = float("-inf")
        self._timer: asyncio.TimerHandle | None = None

    def open(self) -> "OutputStream":
        self.calls += 1
        return OutputStream(self, self.calls)

    def _wrote(self, stream: "OutputStream", *, now: bool = False) -> None:
        if self.interval is None or self.token.cancelled:
            stream.pending.clear()
            return
        if stream not in self._dirty:
            self._dirty.append(stream)
        if self._timer is not None and not now:
            return  # the next push takes this text too
        loop = asyncio.get_running_loop()
        wait = self._last + self.interval - loop.time()
        if wait <= 0 or now:
            self._flush()
        else:
            self._timer = loop.call_later(wait, self._flush)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        dirty, self._dirty = self._dirty, []
        if self.token.cancelled:
            for stream in dirty:
                stream.pending.clear()
            return
        for stream in dirty:
            if not stream.pending:
                continue
            text = "".join(stream.pending)
            stream.pending.clear()
            for start in range(0, len(text), PUSH_CHARS):
                delta = text[start:start + PUSH_CHARS]
                self.publish(self.run_id, json.dumps({
                    "type": "run.output", "run_id": self.run_id, "generation": self.generation,
                    "call": stream.call, "offset": stream.offset, "delta": delta}))
                stream.offset += utf16_length(delta)
        self._last = asyncio.get_running_loop().time()


class OutputStream:
    """The text of one model call as it streams: ``offset`` is where the next push starts
    in the text the page holds for this call (0 again after a retry, which starts over)."""

    def __init__(self, output: LiveOutput, call: int):
        self.output = output
        self.call = call
        self.offset = 0
        self.pending: list[str] = []
        self.closed = False

    def write(self, text: str) -> None:
        if not self.closed and text:
            self.pending.append(text)
            self.output._wrote(self)

    def restart(self) -> None:
        """A retry starts the answer over: the next push replaces what the page shows."""
        self.pending.clear()
        self.offset = 0

    def close(self, *, keep: bool) -> None:
        """No more text; ``keep``: the text still waiting goes out now (the call succeeded),
        else it is dropped (the call failed or was cancelled)."""
        self.closed = True
        if not keep:
            self.pending.clear()
        elif self.pending:
            self.output._wrote(self, now=True)
