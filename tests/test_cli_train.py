"""`mimo-pipes train` refuses what the trainer cannot do before any rank starts: exit 2, one line naming it."""

from __future__ import annotations

import pytest

from mimo_pipes.cli.main import main

CASES = {
    "steps not whole iterations": (["--micro-batch-size", "4", "--global-batch-size", "8", "--steps", "3"], "--steps", "not whole iterations"),
    "stop-after not whole iterations": (["--micro-batch-size", "4", "--global-batch-size", "8", "--steps", "4", "--stop-after", "1", "--save-state", "x"],
                                        "--stop-after", "not whole iterations"),
    "tensor parallel module": (["--component", "language=tp=2,dp=1", "--component", "images=dp=1,rank_offset=2"], "--component", "tp=cp=pp=1"),
    "two encoder modules": (["--component", "language=dp=2", "--component", "images=dp=1,rank_offset=2", "--component", "video=dp=1,rank_offset=3"],
                            "--component", "exactly one encoder module"),
    "learning rate": (["--lr", "0"], "--lr", "must be positive"),
    "run's own checks": (["--intra-microbatch-reorder"], "--intra-microbatch-reorder", "--scalable-dp"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_training_setting_exits_2_naming_it(name, capsys) -> None:
    argv, setting, fragment = CASES[name]
    assert main(["train", "--steps", "4", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mimo-pipes train: error: ") and setting in err[0] and fragment in err[0], err


def test_train_help_documents_its_flags(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "--lr" in out and "--vision-tower" in out and "--intra-microbatch-reorder" in out
