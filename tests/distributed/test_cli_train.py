"""`mimo-pipes train` refuses what the trainer cannot do before any rank starts: exit 2, one line naming it."""

from __future__ import annotations

import dataclasses
import re

import pytest
from job_runs import train_in_pool
from small_processor import small_processor_path
from state_folders import save_job

from mimo_pipes.checkpoint.validity import show_setting
from mimo_pipes.cli.job.resume_checks import OPTION_EXEMPT, WHY, check_resume_dir, setting_flag
from mimo_pipes.cli.main import build_parser, main
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.flags import NAMING
from mimo_pipes.config.job_options import TrainOptions
from mimo_pipes.demo_model.encoders import vision_tower_config
from mimo_pipes.errors import ConfigError

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


# --- train --resume: every option that shapes the losses must match the checkpoint ---------------------


def train_flags() -> set[str]:
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    return {option for action in train._actions for option in action.option_strings}


def save_meta(directory, options: TrainOptions, config: PipelineConfig | None = None, world_size: int = 4,
              model_files: bool = False) -> None:
    save_job(directory, config or PipelineConfig(), options, world_size=world_size, consumed=2, model_files=model_files)


def changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 + 1
    return "elsewhere" if value is None else f"{value}-other"


def test_resume_compares_every_training_option_but_the_exempt_ones(tmp_path, monkeypatch) -> None:
    """A new option is compared unless it is added to OPTION_EXEMPT: none can slip through unchecked."""
    monkeypatch.setenv(NAMING, "flags")  # the command's check: settings named by their flags
    saved = TrainOptions()
    save_meta(tmp_path, saved)
    names = {field.name for field in dataclasses.fields(TrainOptions)}
    assert set(OPTION_EXEMPT) <= names, "OPTION_EXEMPT names an option that does not exist"
    flags, compared = train_flags(), set()
    for name in sorted(names):
        assert setting_flag(name) in flags, f"{name}: {setting_flag(name)} is not a train flag"
        value = changed(getattr(saved, name))
        options = dataclasses.replace(saved, **{name: 3 if name in TrainOptions.COUNTS and value == "elsewhere" else value})  # counts are ints
        if name in OPTION_EXEMPT:
            assert check_resume_dir(str(tmp_path), PipelineConfig(), 4, options) == 2, name
            continue
        with pytest.raises(ConfigError) as raised:
            check_resume_dir(str(tmp_path), PipelineConfig(), 4, options)
        before, now = (show_setting(getattr(o, name)) for o in (saved, options))
        assert str(raised.value) == f"--resume: {tmp_path} was saved with {setting_flag(name)} {before}, this run has {now}: {WHY[name]}"
        compared.add(name)
    assert compared == {"recipe", "lr", "vision_tower"}


def test_resume_compares_a_vision_tower_folders_config(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(NAMING, "flags")  # the command's check: settings named by their flags
    tower = tmp_path / "tower"
    tower.mkdir()
    vision_tower_config("tiny").save_pretrained(tower)
    save_meta(tmp_path, TrainOptions(vision_tower=str(tower)))
    assert check_resume_dir(str(tmp_path), PipelineConfig(), 4, TrainOptions(vision_tower=str(tower))) == 2
    vision_tower_config("tiny", depth=3).save_pretrained(tower)  # same folder, another model
    with pytest.raises(ConfigError, match=rf"saved with --vision-tower {tower} \(config.json sha256 [0-9a-f]{{12}}\), this run has "
                                          rf"{tower} \(config.json sha256 [0-9a-f]{{12}}\): {WHY['vision_tower']}$"):
        check_resume_dir(str(tmp_path), PipelineConfig(), 4, TrainOptions(vision_tower=str(tower)))


@pytest.mark.parametrize("flags, named, saved, given", [
    (["--lr", "0.05"], "--lr", "0.1", "0.05"),
    (["--vision-tower", "qwen2-vl-675m"], "--vision-tower", "tiny", "qwen2-vl-675m"),
    (["--seed", "3"], "--seed", str(PipelineConfig().seed), "3"),  # a config field, as for run
])
def test_train_resume_with_another_option_exits_2_naming_it(tmp_path, capsys, flags, named, saved, given) -> None:
    save_meta(tmp_path, TrainOptions())
    assert main(["train", "--steps", "4", "--resume", str(tmp_path), *flags]) == 2  # before any rank starts
    err = capsys.readouterr().err.strip().splitlines()
    why = f": {WHY[named.lstrip('-').replace('-', '_')]}"  # every compared setting says why it must match
    assert err == [f"mimo-pipes train: error: --resume: {tmp_path} was saved with {named} {saved}, this run has {given}{why}"]


def test_train_resume_is_free_to_change_what_does_not_shape_the_losses(tmp_path, capsys) -> None:
    save_meta(tmp_path, TrainOptions())
    argv = ["train", "--steps", "8", "--resume", str(tmp_path), "--quiet", "--log-interval", "3", "--dump-assignments", "d"]
    assert main(argv) == 2  # gets past the comparison: refused only for the model state this fake checkpoint lacks
    assert "has no model state for rank 0 (rank0.pt)" in capsys.readouterr().err


def test_bad_vision_tower_exits_2_naming_it(capsys) -> None:
    assert main(["train", "--steps", "4", "--vision-tower", "no-such-tower"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mimo-pipes train: error: --vision-tower: vision tower 'no-such-tower' is neither")


def metrics_lines(stderr: str) -> dict[str, str]:
    """Each module's last metrics line, up to its times (the times are each run's own). A line may follow the
    progress bar's last redraw on the same line of stderr."""
    return dict(re.findall(r"exchange metrics: (\w+): (.*?), exchange ", stderr))


def test_stop_save_refuse_another_lr_and_resume_with_running_totals(gloo_pool, tmp_path, capsys) -> None:
    """Through the command's checks and its per-rank body (on the pool's ranks): the checkpoint records --lr
    (a resume with another one exits 2 on one line), and the resumed run's metrics count from the start of
    training, not from the resume."""
    flags = ["--component", "language=dp=2", "--component", "images=dp=1,rank_offset=2", "--micro-batch-size", "4",
             "--global-batch-size", "8", "--scalable-dp", "--intra-microbatch-reorder", "--reorder-window-size", "2",
             "--reorder-across-microbatches", "--seq-length", "1536", "--embedded-samples", "32", "--steps", "4",
             "--processor", small_processor_path()]  # images of at most 320 tokens: the checks do not depend on their size
    saved = train_in_pool(gloo_pool, [*flags, "--stop-after", "2", "--save-state", str(tmp_path / "ckpt"), "--log-interval", "0"])
    stderr = "".join(outcome["stderr"] for outcome in saved if outcome)
    assert set(metrics_lines(stderr)) == {"language", "images"}
    assert metrics_lines(stderr)["language"].startswith("1 windows, 2 micro-batches")
    assert main(["train", *flags, "--resume", str(tmp_path / "ckpt"), "--lr", "0.05"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"mimo-pipes train: error: --resume: {tmp_path / 'ckpt'} was saved with --lr 0.1, this run has 0.05: {WHY['lr']}"]
    resumed = train_in_pool(gloo_pool, [*flags, "--resume", str(tmp_path / "ckpt"), "--log-interval", "0"])
    lines = metrics_lines("".join(outcome["stderr"] for outcome in resumed if outcome))
    assert lines["language"].startswith("2 windows, 4 micro-batches") and lines["images"].startswith("2 windows, 4 micro-batches")
    assert re.search(r"^\s+2\s+\d+\.\d{6}\s", resumed[0]["stdout"], re.MULTILINE)  # iteration 2 trained
