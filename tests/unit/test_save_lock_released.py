"""The --save-state folder's lock is given back when the job ends, under torchrun too, where each rank's
process ends without the interpreter's teardown (no ``finally`` of the command runs after it): a SIGTERM to
torchrun, a failure or a finished run leave the committed state and no ``lock`` beside it."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from mimo_pipes.checkpoint import LOCK_FILE
from mimo_pipes.cli.commands import run_cmd
from mimo_pipes.cli.job import launcher
from mimo_pipes.cli.rank.stop_signal import StopRequested


class Exited(Exception):
    pass


@pytest.mark.parametrize("ending", ["stopped by SIGTERM", "failed", "finished"])
def test_a_torchrun_rank_releases_the_lock_before_its_process_ends(tmp_path, monkeypatch, ending):
    folder = tmp_path / "state"
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    monkeypatch.setattr(run_cmd, "prepare_recipe", lambda config, options: None)
    at_exit: list[tuple[int, bool]] = []

    def exit_now(status: int) -> None:  # the process would end here: record whether the lock was still there
        at_exit.append((status, (folder / LOCK_FILE).exists()))
        raise Exited

    monkeypatch.setattr(launcher, "exit_now", exit_now)

    def rank_main(rank, world_size, config, options):
        assert (folder / LOCK_FILE).exists()  # held while the rank runs
        if ending == "stopped by SIGTERM":
            raise StopRequested(signal.SIGTERM, str(folder))
        if ending == "failed":
            raise RuntimeError("the rank failed")

    options = SimpleNamespace(save_state=str(folder), progress=False)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(Exited):
            run_cmd.start_job(SimpleNamespace(), command="mimo-pipes run", checked=lambda args: (None, options, 1),
                              rank_main=lambda: rank_main)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert len(at_exit) == 1 and at_exit[0][1] is False, at_exit
    assert (at_exit[0][0] == 0) == (ending == "finished")
