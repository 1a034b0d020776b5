"""How text shown to people is shortened: one rule for every cut the code makes.

A run's error, an activity line, a provider's error message, a value quoted back in an
error: each is cut to a size, and a cut text ends with "…" so its reader knows there was
more. Ids are shown by their first eight characters (a UUID's first group), in reasons,
pages and the page's toasts alike.
"""

import re

ELLIPSIS = "…"
SHORT_ID = 8  # characters


def clipped(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit - 1`` and
    an ellipsis: never longer than ``limit``, so it fits a column of that size."""
    if len(text) <= limit:
        return text
    return text[:max(limit - 1, 0)] + ELLIPSIS


def short_id(value) -> str:
    """An id as people read it in a sentence or a row: its first ``SHORT_ID`` characters."""
    return str(value)[:SHORT_ID]


ID_SHOWN = 40  # characters of an id quoted back in an error: a UUID's 36 fit


def quoted_id(value) -> str:
    """An id a request named, as an error quotes it back: cut to ``ID_SHOWN`` characters
    and on one line, whatever the client sent."""
    return clipped(CONTROLS.sub("", str(value)), ID_SHOWN)


def first_line(text: str | None) -> str:
    """The first line of a text (an error, for a row whose whole text is in its title)."""
    text = (text or "").strip()
    return text.splitlines()[0] if text else ""


# Characters that change how a terminal or a page shows the text around them: C0 and C1
# controls (newlines, escape sequences) and the bidirectional overrides and isolates.
CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def plain_name(name: str) -> str:
    """A name (an actor's) without control or bidi characters, trimmed."""
    return CONTROLS.sub("", name).strip()
