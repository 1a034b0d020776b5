"""The web process gives back the memory a burst of large requests took.

What Python frees goes back to glibc's malloc, which keeps much of it for reuse instead of
returning it to the system: a block freed inside one of its arenas is not returned while
anything above it is in use, and the threshold above which a block is mapped on its own (and
unmapped when freed) rises after each large block freed, up to 32 MiB, so that later large
bodies land in the arenas too. After the hostile-input attack of ``manage.py bench hostile``
daphne stayed 15 % above its level before, although no Python object was left over (a
``gc.collect()`` gave nothing back, ``malloc_trim`` 10 MiB).

So, in the web process and on glibc only (elsewhere nothing changes):

* ``tune`` fixes the mapping threshold at ``AWAKEN_MALLOC_MMAP_BYTES`` (a fixed threshold
  no longer rises): request and response bodies, pages of runs and JSON texts that large
  are mapped apart and unmapped when freed;
* a thread calls ``malloc_trim(0)`` every ``AWAKEN_MALLOC_TRIM_SECONDS``, which returns the
  free pages inside the arenas to the system (a few milliseconds).

Python's own allocator for small objects keeps arenas of 1 MiB as long as one object in them
lives, beyond the reach of both: the ``Procfile`` starts the web process with
``PYTHONMALLOC=malloc`` (which only the environment can set), so that they come from malloc
too.
"""

import ctypes
import logging
import sys
import threading
import time

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt's parameter, from glibc's malloc.h


def glibc():
    """The C library if it is glibc (it has ``malloc_trim``), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def tune(*, mmap_bytes: int) -> bool:
    """Fix malloc's mapping threshold at ``mmap_bytes`` (0: leave it as it is). Returns
    whether it was set."""
    libc = glibc()
    if libc is None or not mmap_bytes:
        return False
    return libc.mallopt(M_MMAP_THRESHOLD, mmap_bytes) == 1


def trim() -> bool:
    """Return the free memory of every arena to the system; whether any was."""
    libc = glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


_trimmer: threading.Thread | None = None


def start_trimmer(every: float) -> threading.Thread | None:
    """A daemon thread that trims every ``every`` seconds: one per process, and none if
    ``every`` is 0 or the C library is not glibc."""
    global _trimmer
    if every <= 0 or glibc() is None or _trimmer is not None:
        return _trimmer

    def loop():
        while True:
            time.sleep(every)
            try:
                trim()
            except Exception:  # noqa: BLE001  it must not end the thread
                log.warning("malloc_trim failed", exc_info=True)

    _trimmer = threading.Thread(target=loop, name="malloc-trim", daemon=True)
    _trimmer.start()
    return _trimmer
