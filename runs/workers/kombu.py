"""The late answers to live commands: the one place that knows how kombu's remote-control
mailbox keeps them.

A live command's answer is read from a reply queue of the asking thread's own (kombu names
it after the node, the process, the thread and the bound mailbox's address, which the
thread's next command often takes again). An answer that comes after its asker stopped
waiting (a worker thawed, say, which answers ``applied: false`` to what it drops) is read by
the next collection on that queue, and kombu keeps it in the mailbox's ``unclaimed``, under
its ticket, for a collection of that ticket. None ever comes: a collection takes what is
kept for its own ticket only as it begins, before it reads its queue, and by then the
asking thread has had its answer or given up. Celery's ``broadcast`` binds a shallow copy
of ``app.control.mailbox`` to each connection, so every copy keeps to the one dictionary of
the process, which would grow by an entry for each late answer for as long as the process
lives.

``forget_late_answers`` empties it once a command's collection is over, and counts what it
drops. Every entry is a late answer: a thread's own answers come to its own queue, which
only that thread reads. What this relies on beyond kombu's documented API, and
``tests/test_kombu_contract.py`` checks on every upgrade: a bound copy shares ``unclaimed``
with the mailbox it was made from; a collection keeps another ticket's reply there and
takes only its own ticket's.
"""

from prometheus_client import Counter

LATE_ANSWERS = Counter("awaken_late_answers", "Answers to live commands that came after their "
                       "asker had stopped waiting (a frozen or slow worker), dropped.")


def forget_late_answers(mailbox) -> None:
    """Drop the answers ``mailbox`` (``app.control.mailbox``) keeps for collections that
    are over, counting them."""
    late = mailbox.unclaimed
    for ticket in list(late):
        LATE_ANSWERS.inc(len(late.pop(ticket, ())))
