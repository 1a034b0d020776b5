"""One tool call as the product names it: its tool, its arguments and their digest.

An approval ticket is bound to one action, a stop receipt lists the actions in flight by
digest, and the loop guard counts repeats of the same digest. The digest is the SHA-256 hex
of the canonical JSON of ``{"tool": …, "arguments": …}``: sorted keys, no spaces, UTF-8 (not
``\\u`` escapes), so any client can compute it from the ticket's JSON.
"""

import hashlib
import json


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def action_digest(tool: str, arguments) -> str:
    """The digest of a call of ``tool`` with ``arguments`` (any JSON value)."""
    text = canonical_json({"tool": tool, "arguments": arguments})
    return hashlib.sha256(text.encode()).hexdigest()
