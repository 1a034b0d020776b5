"""The worker's event loop and its database threads.

Every attempt of a worker process runs on one asyncio loop, in a thread named
``awaken-executor``. The domain is synchronous, so its calls go to a few ``awaken-db``
threads; each keeps its own pooled connection between calls (giving it back after every
call costs more than the call), and gives it back after a database error, so the next call
takes a fresh one.
"""

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from django.db import DatabaseError, close_old_connections, connections


class WorkerLoop:
    def __init__(self, *, db_threads: int):
        self.db_threads = db_threads
        self._db = ThreadPoolExecutor(db_threads, thread_name_prefix="awaken-db")
        self.loop = asyncio.new_event_loop()
        # The loop's own executor (name lookups among its calls), held to be shut down.
        self._calls = ThreadPoolExecutor(thread_name_prefix="awaken-loop")
        self.loop.set_default_executor(self._calls)
        self._thread = threading.Thread(target=self._serve, name="awaken-executor",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine) -> Future:
        """Run ``coroutine`` on the loop, from any thread."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def db(self, fn, /, **kwargs):
        """``fn(**kwargs)`` on a database thread, awaited on the loop."""
        return await self.loop.run_in_executor(self._db, partial(_call_db, fn, kwargs))

    def close(self) -> None:
        """Close the database threads' connections and stop the loop. A worker process just
        exits; this is for a loop made in a process that goes on (a test)."""
        together = threading.Barrier(self.db_threads)

        def close_connections(_):
            together.wait(10)  # one call per thread: each closes its own connection
            connections.close_all()

        list(self._db.map(close_connections, range(self.db_threads)))
        self._db.shutdown()

        async def stop():
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # The loop's own executor's threads end too, each idle one now and one still in
            # a call once it returns: no call holds up the loop's stop.
            self._calls.shutdown(wait=False, cancel_futures=True)
            asyncio.get_running_loop().stop()

        self.submit(stop())


def _call_db(fn, kwargs):
    try:
        return fn(**kwargs)
    except DatabaseError:
        close_old_connections()
        raise
