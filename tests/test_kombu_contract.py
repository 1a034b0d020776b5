"""What runs/workers/kombu.py relies on in kombu's remote-control mailbox beyond its
documented API, checked on every upgrade, and what the live commands do with it: the late
answers a collection reads are dropped once it is over, not kept for the process's life."""

import pytest
from celery import current_app
from prometheus_client import REGISTRY

from runs.domain.errors import NotActive
from runs.workers import dispatch

# No test here uses the test database: its verdict is the same on either backend.
pytestmark = pytest.mark.one_backend


@pytest.fixture
def mailbox():
    """The process's mailbox, with nothing kept in it before or after the test."""
    mailbox = current_app.control.mailbox
    mailbox.unclaimed.clear()
    yield mailbox
    mailbox.unclaimed.clear()


def reply(bound, ticket: str, applied: bool) -> None:
    """An answer to the command of ``ticket``, sent to ``bound``'s reply queue as a worker
    node sends it."""
    bound._publish_reply({"worker@host": {"applied": applied}}, bound.reply_exchange.name,
                         bound.oid, ticket)


def test_a_bound_copy_keeps_late_answers_in_its_mailboxs_one_dictionary(mailbox):
    with current_app.connection_for_write() as connection:
        assert mailbox(connection).unclaimed is mailbox.unclaimed


def test_a_collection_keeps_another_tickets_answer_and_takes_only_its_own(mailbox):
    with current_app.connection_for_write() as connection:
        bound = mailbox(connection)
        bound.reply_queue(connection.default_channel).declare()
        reply(bound, "an-earlier-command", False)  # its asker gave up on it
        reply(bound, "this-command", True)
        assert bound._collect("this-command", limit=2, timeout=1) == [
            {"worker@host": {"applied": True}}]
        assert {ticket: list(kept) for ticket, kept in mailbox.unclaimed.items()} == {
            "an-earlier-command": [{"worker@host": {"applied": False}}]}
        # Only a collection of that ticket, beginning, would take it.
        assert list(bound._collect("an-earlier-command", limit=1, timeout=1)) == [
            {"worker@host": {"applied": False}}]
        assert not mailbox.unclaimed


def test_a_live_command_drops_the_late_answers_its_collection_read(mailbox, settings):
    """A command to a node that never answers, with two late answers to earlier commands
    kept: they are gone once its collection is over, and counted."""
    settings.AWAKEN_DELIVERY_TIMEOUT = 0.2
    mailbox.unclaimed["earlier-1"].append({"worker@host": {"applied": False}})
    mailbox.unclaimed["earlier-2"].append({"worker@host": {"applied": False}})
    before = late_answers()
    with pytest.raises(NotActive):
        dispatch.send_command_and_wait(run_id="00000000-0000-0000-0000-000000000000",
                                       generation=1, owner="nobody@nowhere:1",
                                       command="cancel", actor="tests", source="api")
    assert not mailbox.unclaimed
    assert late_answers() - before == 2


def late_answers() -> float:
    return REGISTRY.get_sample_value("awaken_late_answers_total")
