"""The in-process pieces: cancellation tokens, the registry, waits raced against them, and
the ends of attempts gathered into one transaction."""

import asyncio
import threading
from queue import SimpleQueue

import pytest

from harness.processes import wait_until
from runs import domain
from runs.domain import Ending
from runs.runtime.agent import Context, Interrupted
from runs.runtime.ends import GATHER, Ends
from runs.runtime.loop import WorkerLoop
from runs.runtime.registry import Entry, Registry
from runs.runtime.token import CancellationToken, Why

# No test here uses the test database: its verdict is the same on either backend.
pytestmark = pytest.mark.one_backend


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


# --- the ends of a worker's attempts, gathered while one is written -----------------------


class HeldDb:
    """A worker loop's ``db`` that holds every call until let go: the calls, and answers as
    the database would give them (an end of generation 1 is committed; run "gone" is
    not found; a batch fails when ``batches_fail``)."""

    def __init__(self, batches_fail=False):
        self.calls: list[tuple[str, object]] = []
        self.go = asyncio.Event()
        self.batches_fail = batches_fail

    async def db(self, fn, /, **kwargs):
        if fn is domain.attempts_finish:
            self.calls.append((fn.__name__, [end["run_id"] for end in kwargs["ends"]]))
        else:
            self.calls.append((fn.__name__, kwargs["run_id"]))
        await self.go.wait()
        if fn is domain.attempts_finish:
            if self.batches_fail:
                raise domain.RunNotFound("No run with id 'gone'.")
            return [end["generation"] == 1 for end in kwargs["ends"]]
        if kwargs["run_id"] == "gone":
            raise domain.RunNotFound("No run with id 'gone'.")
        return kwargs["generation"] == 1


async def until(condition, turns=1000):
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("not reached")


def ended(ends, run_id, generation=1, **kwargs):
    return asyncio.ensure_future(ends.finish(run_id=run_id, generation=generation,
                                             ending=Ending.completed(), **kwargs))


async def behind_a_held_end(db, later, *, child=False) -> list:
    """The answers of run "a"'s end and of the ends of ``later`` ((run id, generation)
    pairs), which come while a's is held in ``db``; with a child run's end before them if
    ``child``, which must not wait."""
    ends = Ends(db)
    first = [ended(ends, "a")]
    await until(lambda: db.calls)
    if child:
        first.append(ended(ends, "child", parent_id="a"))
        await until(lambda: len(db.calls) == 2)  # at once, beside the end being written
    waiting = [ended(ends, run_id, generation) for run_id, generation in later]
    await until(lambda: len(ends._waiting) == len(later))
    db.go.set()
    answers = await asyncio.gather(*first, *waiting, return_exceptions=True)
    assert await ended(ends, "next") and db.calls[-1] == ("attempt_finish", "next")
    del db.calls[-1]  # the writer is free again: the next end goes at once, alone
    return answers


def test_ends_that_come_while_one_is_written_are_written_together():
    db = HeldDb()
    answers = asyncio.run(behind_a_held_end(db, [("b", 1), ("c", 2), ("d", 1)]))
    assert db.calls == [("attempt_finish", "a"), ("attempts_finish", ["b", "c", "d"])]
    assert answers == [True, True, False, True]


def test_an_end_of_a_child_run_and_a_second_end_of_a_run_are_never_gathered():
    db = HeldDb()
    answers = asyncio.run(behind_a_held_end(db, [("b", 1), ("b", 2), ("c", 1)], child=True))
    assert answers == [True, True, True, False, True]
    assert db.calls == [("attempt_finish", "a"), ("attempt_finish", "child"),
                        ("attempts_finish", ["b", "c"]), ("attempt_finish", "b")]


def test_at_most_a_gathering_of_ends_goes_in_one_transaction():
    db = HeldDb()
    answers = asyncio.run(behind_a_held_end(db, [(f"r{i}", 1) for i in range(GATHER + 10)]))
    assert all(answers)
    assert [len(run_ids) for name, run_ids in db.calls[1:]] == [GATHER, 10]


def test_a_gathering_that_fails_is_written_end_by_end_each_with_its_own_answer():
    db = HeldDb(batches_fail=True)
    answers = asyncio.run(behind_a_held_end(db, [("b", 1), ("gone", 1), ("c", 2)]))
    assert answers[:2] == [True, True] and answers[3] is False
    assert isinstance(answers[2], domain.RunNotFound)
    assert db.calls[1:] == [("attempts_finish", ["b", "gone", "c"]), ("attempt_finish", "b"),
                            ("attempt_finish", "gone"), ("attempt_finish", "c")]


def test_ends_waiting_on_a_writer_cancelled_with_the_loop_do_not_wait_for_ever():
    async def main():
        db = HeldDb()
        ends = Ends(db)
        first = ended(ends, "a")
        await until(lambda: db.calls)
        waiting = ended(ends, "b")
        await until(lambda: ends._waiting)
        ends._writer.cancel()
        for end in (first, waiting):
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(end, 10)  # a deadline: a TimeoutError fails
        db.go.set()
        assert await ended(ends, "c")  # a new writer for the next

    asyncio.run(main())


def test_a_closed_worker_loop_leaves_no_thread_behind():
    # A loop made by a process that goes on (an executor of the tests) ends its thread and
    # the threads its calls took from the loop's own executor (a name lookup, say).
    worker_loop = WorkerLoop(db_threads=1)

    async def a_call_on_the_loops_executor():
        return await asyncio.get_running_loop().run_in_executor(None, threading.current_thread)

    used = worker_loop.submit(a_call_on_the_loops_executor()).result(timeout=10)
    assert used.is_alive()  # an executor keeps its threads for the next call
    worker_loop.close()
    wait_until(lambda: not used.is_alive(), 10, "the executor's thread to end")


def test_a_call_stuck_on_the_loops_executor_does_not_keep_it_from_stopping():
    worker_loop, release, threads = WorkerLoop(db_threads=1), threading.Event(), SimpleQueue()

    def hang():
        threads.put(threading.current_thread())
        release.wait()

    async def a_call_that_hangs():
        asyncio.get_running_loop().run_in_executor(None, hang)

    worker_loop.submit(a_call_that_hangs()).result(timeout=10)
    stuck = threads.get(timeout=10)
    try:
        worker_loop.close()
        wait_until(lambda: not worker_loop.loop.is_running(), 10, "the loop to stop")
        assert stuck.is_alive()
    finally:
        release.set()
    wait_until(lambda: not stuck.is_alive(), 10, "its thread to end once the call returns")
