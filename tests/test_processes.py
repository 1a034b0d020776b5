"""The harness's child processes (harness/processes.py) leave nothing behind them."""

import gc
import sys

import pytest

from harness.processes import Process

pytestmark = pytest.mark.one_backend

ENV = {"PATH": "/usr/bin:/bin"}


def test_a_temporary_log_goes_with_its_process(tmp_path):
    process = Process([sys.executable, "-c", "print('said')"], name="short", env=ENV)
    process.wait_exit(30)
    path = process.log_path
    assert path.read_text() == "said\n"
    del process
    gc.collect()
    assert not path.exists()

    kept = Process([sys.executable, "-c", "print('kept')"], name="kept", env=ENV,
                   log_dir=tmp_path)
    kept.wait_exit(30)
    del kept
    gc.collect()
    assert (tmp_path / "kept.log").read_text() == "kept\n"  # a log folder of one's own stays
