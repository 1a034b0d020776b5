"""The harness's child processes (harness/processes.py) leave nothing behind them."""

import gc
import sys
from pathlib import Path

import pytest

from harness.processes import Beat, Process

ENV = {"PATH": "/usr/bin:/bin"}


@pytest.mark.one_backend  # no database: its verdict is the same on either
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


@pytest.mark.postgres  # another process shares only a PostgreSQL database
def test_the_sweepers_schedule_goes_with_its_process():
    beat = Beat()
    folder = Path(beat.argv[beat.argv.index("--schedule") + 1]).parent
    assert folder.is_dir()
    beat.stop()
    del beat
    gc.collect()
    assert not folder.exists()
