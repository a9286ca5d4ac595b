"""Every bad setting fails `mimo-pipes run` before any rank starts: exit 2, one line naming the setting."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mimo_pipes.cli.main import main

REORDER = ["--scalable-dp", "--intra-microbatch-reorder"]

CASES = {
    "encoder dp above language dp": (["--component", "language=dp=1", "--component", "images=dp=2,rank_offset=1"], "--component", "exceeds language dp"),
    "encoder pp": (["--component", "language=dp=2", "--component", "images=pp=2,dp=1,rank_offset=2"], "--component", "pipeline parallelism"),
    "expert tp": (["--component", "language=dp=2,etp=2", "--component", "images=dp=2,rank_offset=4"], "--component", "expert tensor parallelism"),
    # etp adds no ranks: the images module right after dp=2 must not be reported as overlapping.
    "expert tp, adjacent module": (["--component", "language=dp=2,etp=2", "--component", "images=dp=2,rank_offset=2"], "--component", "etp=2"),
    "batch not divisible by grid": (["--micro-batch-size", "6", "--component", "language=dp=4", "--component", "images=dp=2,rank_offset=4"], "--micro-batch-size", "canonical grid size 4"),
    "reorder without scalable dp": (["--intra-microbatch-reorder"], "--intra-microbatch-reorder", "--scalable-dp"),
    "both weights zero": (REORDER + ["--reorder-encoder-cost-weight", "0"], "--reorder-encoder-cost-weight", "both 0"),
    "negative encoder weight": (REORDER + ["--reorder-encoder-cost-weight", "-1"], "--reorder-encoder-cost-weight", "negative"),
    "negative language weight": (REORDER + ["--reorder-language-cost-weight", "-0.5"], "--reorder-language-cost-weight", "negative"),
    "window below 1": (REORDER + ["--reorder-window-size", "0"], "--reorder-window-size", ">= 1"),
    "unpadded with reorder": (REORDER + ["--pad-to-seq-length", "false"], "--pad-to-seq-length", "same length"),
    "drop_last false": (["--drop-last", "false"], "--drop-last", "full global micro-batches"),
    "other sampler": (["--dataloader-type", "external"], "--dataloader-type", "single or cyclic"),
    "missing dataset": (["--dataset", "/nonexistent/data"], "--dataset", "does not exist"),
    "missing processor": (["--processor", "/nonexistent/proc"], "--processor", "does not exist"),
    "window vs global batch": (REORDER + ["--reorder-across-microbatches", "--reorder-window-size", "3", "--global-batch-size", "32"], "--reorder-window-size", "must divide the 4 micro-batches"),
    "gap in ranks": (["--component", "language=dp=2", "--component", "images=dp=2,rank_offset=3"], "--component", "rank 2 belongs to no module"),
    "stop-after without save": (["--stop-after", "2"], "--stop-after", "needs --save-state DIR"),
    "missing resume": (["--resume", "/nonexistent/state"], "--resume", "no saved state"),
    "image paths with samples": (["--exchange-payload", "samples", "--exchange-image-paths"], "--exchange-image-paths", "needs --exchange-payload rows"),
    "summary json a folder": (["--summary-json", "/"], "--summary-json", "is a folder"),
    "negative seed": (["--seed", "-1"], "--seed", "must be an integer >= 0, got -1"),
    "negative embedded samples": (["--embedded-samples", "-1"], "--embedded-samples", "must be an integer >= 1, got -1"),
    "negative global batch": (["--global-batch-size", "-1"], "--global-batch-size", "must be an integer >= 1, got -1"),
    "global batch below a micro-batch": (["--global-batch-size", "4"], "--global-batch-size", "4 is not a multiple of --micro-batch-size 8"),
    "negative workers": (["--num-workers", "-1"], "--num-workers", "must be an integer >= 0, got -1"),
    "exchange timeout": (["--exchange-timeout", "0"], "--exchange-timeout", "must be a positive number of seconds, got 0.0"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_setting_exits_2_naming_it(name, capsys):
    argv, setting, fragment = CASES[name]
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"mimo-pipes run: error: {setting}"), err[0]
    assert fragment in err[0]


@pytest.mark.launch  # a fresh interpreter: the module's own entry; the same refusals in-process are above
def test_console_script_reports_without_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "mimo_pipes.cli.main", "run", "--reorder-window-size", "0", *REORDER],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == "mimo-pipes run: error: --reorder-window-size: must be an integer >= 1, got 0"


def test_nccl_exchange_without_gpus_is_refused(capsys):
    assert main(["run", *REORDER, "--exchange-transport", "nccl"]) == 2
    assert "--exchange-transport: nccl needs one GPU per rank" in capsys.readouterr().err


def test_overlapped_nccl_exchange_refused_under_single_hardware_queue():
    from mimo_pipes.config.flags import flag_names
    from mimo_pipes.config.transport import resolve_exchange_transport
    from mimo_pipes.errors import ConfigError

    with pytest.raises(ConfigError) as info, flag_names():  # a command: the flags
        resolve_exchange_transport("nccl", "nccl", overlap=True, device_max_connections="1")
    message = str(info.value)
    assert "deadlock" in message and "--exchange-transport gloo" in message and "--no-overlap-intra-microbatch-reorder with --read-ahead 0 (" in message
    with pytest.raises(ConfigError) as info:  # Python: the fields
        resolve_exchange_transport("nccl", "nccl", overlap=True, device_max_connections="1")
    message = str(info.value)
    assert message.startswith("exchange_transport: ") and "exchange_transport gloo" in message
    assert "overlap_intra_microbatch_reorder False" in message and "--" not in message
    assert resolve_exchange_transport("nccl", "nccl", overlap=False, device_max_connections="1") == "nccl"
    assert resolve_exchange_transport("auto", "nccl", overlap=True, device_max_connections="1") == "gloo"
    assert resolve_exchange_transport("auto", "nccl", overlap=True, device_max_connections=None) == "gloo"
    assert resolve_exchange_transport("auto", "nccl", overlap=False, device_max_connections=None) == "nccl"
    assert resolve_exchange_transport("auto", "gloo", overlap=True, device_max_connections=None) == "gloo"


def test_an_unknown_payload_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["run", "--exchange-payload", "pixels"])
    assert exited.value.code == 2
    assert "argument --exchange-payload: invalid choice: 'pixels' (choose from 'rows', 'samples')" in capsys.readouterr().err


def test_a_payload_set_in_code_is_checked_by_name():
    from mimo_pipes.config import PipelineConfig
    from mimo_pipes.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^exchange_payload: must be one of rows, samples, got 'pixels'$"):  # set in code: the field
        PipelineConfig(exchange_payload="pixels").validate()
