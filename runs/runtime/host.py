"""The host interface: everything an agent's context may ask of the process that runs it.

``Context`` (``runs.runtime.agent``) is what agent code sees; behind it, one ``Host`` per
attempt does what needs the world outside the agent: commits, pauses, the live inbox, the
activity log, child runs, the model provider, threads for blocking tools. The worker's host
is ``runs.runtime.attempt_host.AttemptHost``; tests give a context a small fake that records
instead of committing. An adapter for another agent framework drives the same context, so
it drives the same host and the same cancellation token.

Every method is called on the attempt's event loop. A method that waits is raced against
the token by the context, or checks it itself (``before_step``), so a cancel is never held
up by the host.
"""

from collections.abc import Callable
from typing import Any, Protocol

from runs.providers.client import ChatClient

# Each method is given the attempt's ``runs.runtime.agent.Context`` (not imported here: the
# context imports this interface).
Context = Any


class Host(Protocol):
    # --- steps -----------------------------------------------------------------------

    async def before_step(self, ctx: Context) -> None:
        """At a step boundary: raise ``Interrupted`` if the token is cancelled, take a
        pause an operator asked for (raise ``Paused`` once it commits), raise
        ``BudgetExceeded`` when a step, token or cost budget is used up."""

    def before_tool(self, ctx: Context, tool: str, arguments, pending: dict) -> str:
        """Before any tool call that goes through the host (``Context.start_tool``: a
        direct ``tool`` call, the tool loop's, an adapter's framework's): its action digest
        (``runs.domain.actions.action_digest``); raise ``BudgetExceeded`` (``max_repeats``)
        when the run's committed calls of that digest and the step's ``pending`` ones
        (digest to count) already reach the loop guard's limit."""

    async def commit_step(self, ctx: Context, *, tokens: int,
                          data: dict | None = None) -> None:
        """Commit the step with ``ctx.state``, ``tokens`` used and its event's ``data``;
        set ``ctx.usage`` to the run's totals as committed. The worker's host may write it
        later (at the next boundary, or with the end), never after anything that may act
        on the world, and sets ``ctx.usage`` to what the write gives at once."""

    async def fence(self, ctx: Context) -> None:
        """Before a tool starts: cancel the token if a cancel or stop of the run is
        committed, though its live signal has not come (the context then refuses the
        tool)."""

    # --- pauses and the live inbox ---------------------------------------------------------

    async def pause(self, ctx: Context, *, reason: str, prompt: Any,
                    schema: dict | None = None, action: dict | None = None) -> None:
        """Move the run to ``awaiting`` with a ticket for ``reason`` (the agent waits for
        input), committed with ``ctx.state``; ``action`` (tool, arguments, rationale) binds
        an approval ticket to that one call. The context raises ``Paused`` after it."""

    async def receive(self, ctx: Context) -> Any:
        """The next item of the attempt's live inbox (a message, or None for a wake),
        waiting for one; a pause asked meanwhile is taken here."""

    def take_inbox(self, ctx: Context) -> list:
        """Every message waiting in the attempt's live inbox, taken at once (no wait)."""

    # --- the activity log --------------------------------------------------------------

    def activity(self, ctx: Context, entry: dict) -> None:
        """Take an entry for the run's activity log; never waits (written off the agent's
        path)."""

    # --- child runs --------------------------------------------------------------------

    async def spawn(self, ctx: Context, agent: str, input: dict) -> Any:
        """Create a child run of ``agent`` and start it here under a child token; its id."""

    async def wait_children(self, ctx: Context) -> list[dict]:
        """Wait for every child this attempt started; their committed ends."""

    # --- the model provider and live output ------------------------------------------------

    @property
    def provider(self) -> ChatClient:
        """The process's client of the model provider."""

    output_per_second: float  # live output pushes per second at most (0: none)

    def publish_output(self, run_id: str, text: str) -> None:
        """Push an encoded live output message to the sockets of the run."""

    # --- blocking tools ----------------------------------------------------------------

    async def run_sync_tool(self, fn: Callable, *args, **kwargs) -> Any:
        """``fn(*args, **kwargs)`` in a thread of its own; the context races it against the
        token and abandons the thread on a cancel."""
