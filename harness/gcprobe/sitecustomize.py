"""Loaded at start by a Python process whose PYTHONPATH names this folder (``bench gc``
starts its processes so): with ``AWAKEN_GC_PROBE`` set to a path, each full pass of the
cyclic collector (generation 2) appends a line to the file of that path suffixed with the
process id: when it ended (seconds since the epoch), its wall time in ms (the process's
threads wait on it, each attempt of a worker among them), what it collected, and how many
objects the collector tracked after it (frozen ones aside). Nothing of the product imports
it."""

import gc
import os
import time

PATH = os.environ.get("AWAKEN_GC_PROBE")

if PATH:
    began = [0.0]

    def timed(phase, info):
        if info["generation"] != 2:
            return
        if phase == "start":
            began[0] = time.perf_counter()
            return
        spent = (time.perf_counter() - began[0]) * 1000
        with open(f"{PATH}.{os.getpid()}", "a") as out:
            out.write(f"{time.time():.3f} {spent:.3f} {info['collected']} "
                      f"{len(gc.get_objects())}\n")

    gc.callbacks.append(timed)
