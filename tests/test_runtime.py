"""The in-process pieces: cancellation tokens, the registry, and waits raced against them."""

import asyncio
import threading

import pytest

from runs.runtime.agent import Context, Interrupted
from runs.runtime.registry import Entry, Registry
from runs.runtime.token import CancellationToken, Why


def test_cancelling_a_parent_cancels_its_children_but_not_the_reverse():
    parent = CancellationToken()
    child, grandchild = parent.child(), None
    grandchild = child.child()
    sibling = parent.child()
    child_only = CancellationToken(parent=parent).child()
    assert child_only.cancel(Why("command")) and not parent.cancelled
    parent.cancel(Why("command", actor="olga"))
    assert child.cancelled and grandchild.cancelled and sibling.cancelled
    assert child.why.kind == "parent" and child.why.actor == "olga"
    assert child_only.why.kind == "command"  # the first reason stands


def test_a_child_of_a_cancelled_token_starts_cancelled():
    parent = CancellationToken()
    parent.cancel(Why("command"))
    assert parent.child().cancelled


def test_a_cancel_from_another_thread_wakes_the_waiting_loop():
    token = CancellationToken()

    async def wait():
        loop = asyncio.get_running_loop()
        threading.Timer(0.05, token.cancel, args=(Why("command"),)).start()
        started = loop.time()
        await asyncio.wait_for(token.wait(), 5)
        return loop.time() - started

    assert asyncio.run(wait()) < 1


class Host:
    def __init__(self):
        self.activity_log = []

    async def run_sync_tool(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def activity(self, ctx, entry):
        self.activity_log.append(entry)


def context(token):
    return Context(run_id="r", generation=1, input={}, state={}, resume=None, token=token,
                   host=Host())


def test_race_drops_the_loser_and_raises_interrupted():
    token = CancellationToken()
    finished = []

    async def slow():
        await asyncio.sleep(0.5)
        finished.append("late")
        return "late"

    async def main():
        ctx = context(token)
        asyncio.get_running_loop().call_later(0.02, token.cancel, Why("command"))
        with pytest.raises(Interrupted):
            await ctx.infer(slow())
        await asyncio.sleep(0.6)

    asyncio.run(main())
    assert finished == []  # the loser was cancelled, its result never produced


def test_race_returns_the_result_when_not_cancelled():
    async def main():
        return await context(CancellationToken()).infer(asyncio.sleep(0, result=7))

    assert asyncio.run(main()) == 7


def test_a_cancelled_token_stops_work_before_it_starts():
    token = CancellationToken()
    token.cancel(Why("command"))
    started = []

    async def work():
        started.append(1)

    async def main():
        with pytest.raises(Interrupted):
            await context(token).infer(work())

    asyncio.run(main())
    assert started == []


def entry(run_id="r", generation=1):
    return Entry(run_id, generation, CancellationToken())


def test_a_stale_generation_cannot_unregister_its_replacement():
    registry = Registry()
    registry.register(entry(generation=1))
    registry.register(entry(generation=2))
    assert not registry.unregister("r", 1)
    assert registry.get("r").generation == 2
    assert registry.unregister("r", 2) and registry.get("r") is None


def test_an_older_generation_cannot_register_over_a_newer_one():
    registry = Registry()
    newer, older = entry(generation=3), entry(generation=2)
    assert registry.register(newer)
    assert not registry.register(older)
    assert registry.get("r") is newer and not newer.token.cancelled


def test_a_command_for_another_generation_is_not_active():
    registry = Registry()
    current = entry(generation=2)
    registry.register(current)
    assert registry.apply("r", 1, "cancel") is None
    assert not current.token.cancelled
    assert registry.apply("r", 2, "cancel", actor="olga") is current
    assert current.token.why.actor == "olga"
    assert registry.apply("r", 2, "cancel") is None  # already cancelled: nothing to do
    assert registry.apply("nope", None, "wake") is None


def test_pause_sets_the_signal_observed_at_the_next_boundary():
    registry = Registry()
    current = entry()
    registry.register(current)
    registry.apply("r", 1, "pause", actor="olga")
    assert current.pause_requested.is_set() and current.pause_actor == "olga"
    assert not current.token.cancelled
