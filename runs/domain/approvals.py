"""Approvals bound to one action: the ticket's ``action`` and the decisions that answer it.

An agent asks for approval of one tool call (``ctx.approval(tool, arguments)``); the run
moves to ``awaiting`` with an approval ticket whose ``action`` is that call: its tool, its
arguments, their digest (``runs.domain.actions.action_digest``) and the agent's rationale.
The resume input for such a ticket is a decision, checked here and nowhere else:

* ``{"approved": true}``: the call runs with exactly the arguments shown;
* ``{"approved": true, "arguments": {...}}``: it runs with the edited ones (both are kept:
  the proposed ones on the ticket, the edited ones in its resume input);
* ``{"approved": false, "reason": "..."}``: the call is refused and the agent is told why.

An optional ``"digest"`` names the action the decider saw; any other digest than the
ticket's is a ``TicketMismatch`` (the decision was made for another action).
"""

from dataclasses import dataclass

from django.conf import settings

from runs.domain import limits
from runs.domain.actions import action_digest
from runs.domain.errors import InvalidRequest, TicketMismatch

MAX_TOOL_NAME = 200
MAX_RATIONALE = 2000
MAX_REASON = 500
DECISION_KEYS = frozenset({"approved", "arguments", "reason", "digest"})


def action_of(*, tool, arguments, rationale=None) -> dict:
    """The ``action`` of an approval ticket for a call of ``tool`` with ``arguments``,
    checked: a tool name, an object of arguments storable as JSON (within
    AWAKEN_MAX_INPUT_BYTES), a rationale of at most ``MAX_RATIONALE`` characters or none."""
    if not isinstance(tool, str) or not tool.strip() or len(tool) > MAX_TOOL_NAME:
        raise InvalidRequest(f"An action's tool is a name of 1 to {MAX_TOOL_NAME} characters.",
                             field="action.tool")
    limits.check_text(tool, "action.tool")
    if not isinstance(arguments, dict):
        raise InvalidRequest("An action's arguments are a JSON object.",
                             field="action.arguments")
    limits.check_json(arguments, "action.arguments")
    limits.check_size(arguments, "action.arguments", settings.AWAKEN_MAX_INPUT_BYTES)
    if rationale is not None:
        if not isinstance(rationale, str):
            raise InvalidRequest("An action's rationale is text.", field="action.rationale")
        limits.check_text(rationale, "action.rationale")
        rationale = rationale.strip()[:MAX_RATIONALE] or None
    return {"tool": tool, "arguments": arguments, "digest": action_digest(tool, arguments),
            "rationale": rationale}


@dataclass(frozen=True)
class Decision:
    """A checked decision on one action."""

    approved: bool
    arguments: dict | None  # the ones to run (None when refused)
    edited: bool
    reason: str | None

    @property
    def outcome(self) -> str:
        """``approved``, ``edited`` or ``refused``: what the timeline says."""
        return "refused" if not self.approved else "edited" if self.edited else "approved"

    def stored(self) -> dict:
        """The decision as the ticket's resume input keeps it."""
        value: dict = {"approved": self.approved}
        if self.edited:
            value["arguments"] = self.arguments
        if self.reason is not None:
            value["reason"] = self.reason
        return value

    def event_data(self, action: dict) -> dict:
        """What the ``resumed`` event records of it: the outcome, the action's tool and
        digest, the arguments that run (and the proposed ones when edited), the reason."""
        data: dict = {"decision": self.outcome, "tool": action["tool"],
                      "digest": action["digest"]}
        if self.approved:
            data["arguments"] = self.arguments
        if self.edited:
            data["proposed_arguments"] = action["arguments"]
        if self.reason is not None:
            data["reason"] = self.reason
        return data


def decision_of(action: dict, value) -> Decision:
    """The decision that ``value`` (a resume input) makes on ``action``, or a refusal:
    InvalidRequest for anything but the three shapes above, TicketMismatch for a digest
    other than the action's. Checked before anything changes."""
    if not isinstance(value, dict) or not isinstance(value.get("approved"), bool):
        raise InvalidRequest('An approval is answered {"approved": true} (optionally with '
                             'edited "arguments") or {"approved": false, "reason": "..."}.',
                             field="input.approved")
    unknown = set(value) - DECISION_KEYS
    if unknown:
        raise InvalidRequest(f"Unknown fields in the decision: {', '.join(sorted(unknown))}.",
                             field="input")
    if "digest" in value and value["digest"] != action["digest"]:
        raise TicketMismatch("The decision names another action (digest "
                             f"{str(value['digest'])[:16]}…) than the ticket's "
                             f"({action['digest'][:16]}…).")
    reason = value.get("reason")
    if reason is not None:
        if not isinstance(reason, str):
            raise InvalidRequest("The reason is text.", field="input.reason")
        limits.check_text(reason, "input.reason")
        reason = reason.strip() or None
        if reason is not None and len(reason) > MAX_REASON:
            raise InvalidRequest(f"The reason is longer than {MAX_REASON} characters.",
                                 field="input.reason")
    if not value["approved"]:
        if "arguments" in value:
            raise InvalidRequest("A refusal runs nothing: it takes no arguments.",
                                 field="input.arguments")
        return Decision(approved=False, arguments=None, edited=False, reason=reason)
    arguments = value.get("arguments", action["arguments"])
    if not isinstance(arguments, dict):
        raise InvalidRequest("Edited arguments are a JSON object.", field="input.arguments")
    limits.check_json(arguments, "input.arguments")
    return Decision(approved=True, arguments=arguments,
                    edited=action_digest(action["tool"], arguments) != action["digest"],
                    reason=reason)
