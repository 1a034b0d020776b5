"""What the pages' script needs to know of the server's rules, given to it as data.

The script renders nothing of its own: rows and panels are the server's rendering. Where it
still writes a sentence (a toast naming a run, the resume dialog's "why"), it takes the
server's rule from here, embedded in each page with ``json_script`` as ``#page-rules``, so
it keeps no copy.
"""

from runs.domain.text import SHORT_ID
from runs.models import TicketReason

# What the resume dialog tells the operator about the open ticket, by its reason.
RESUME_WHY = {
    TicketReason.APPROVAL: "The agent asks for approval.",
    TicketReason.INPUT: "The agent asks for input.",
    TicketReason.MANUAL_PAUSE: "Paused by an operator.",
    TicketReason.BUDGET: "A budget was reached: resuming needs a higher limit, "
                         '{"budget": {"max_cost_usd": …}}.',
    TicketReason.PROVIDER: "The model provider kept failing: resume once it is back.",
    TicketReason.LOOP: "The loop guard: the same tool call repeated past max_repeats.",
}


def page_rules() -> dict:
    return {"short_id": SHORT_ID,
            "resume_why": {str(reason): text for reason, text in RESUME_WHY.items()}}
