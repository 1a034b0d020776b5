"""The harness's child processes (harness/processes.py) leave nothing behind them."""

import gc
import sys
from pathlib import Path

import pytest

from harness.processes import Beat, Process, scratch_folder

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


@pytest.mark.one_backend
def test_a_scratch_folder_goes_when_its_block_ends_and_stays_when_it_fails(capsys):
    with scratch_folder("awaken-test-") as folder:
        process = Process([sys.executable, "-c", "print('ran')"], name="ran", env=ENV,
                          log_dir=folder)
        process.wait_exit(30)
        assert (folder / "ran.log").read_text() == "ran\n"
    assert not folder.exists()

    with pytest.raises(RuntimeError), scratch_folder("awaken-test-") as failed:
        (failed / "why.log").write_text("the reason")
        raise RuntimeError("the block failed")
    try:
        assert (failed / "why.log").read_text() == "the reason"
        assert str(failed) in capsys.readouterr().err
    finally:
        (failed / "why.log").unlink()
        failed.rmdir()
