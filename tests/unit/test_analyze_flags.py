"""analyze takes run's command line: every flag of run means to analyze what it means to run, or is
accepted and ignored (it moves no sample, and analyze's help says so), or is refused as not applying."""

from __future__ import annotations

import json
import re

import pytest
from job_runs import analyze_here
from PIL import Image
from real_data import write_dataset

from mimo_pipes.cli.analyze_cmd import HONOURED, IGNORED, REFUSED
from mimo_pipes.cli.main import build_parser

SMALL = ["--embedded-samples", "48", "--micro-batch-size", "4", "--steps", "6", "--quiet", "--scalable-dp", "--intra-microbatch-reorder",
         "--reorder-window-size", "2", "--reorder-across-microbatches", "--seed", "7"]


def _flags(command: str) -> dict[str, object]:
    parser = build_parser()
    sub = next(action for action in parser._actions if hasattr(action, "choices") and isinstance(action.choices, dict)).choices[command]
    return {action.option_strings[0]: action for action in sub._actions if action.option_strings and action.option_strings[0] != "-h"}


def test_every_flag_of_run_is_honoured_ignored_or_refused_by_analyze():
    run, analyze = _flags("run"), _flags("analyze")
    kinds = [set(HONOURED), set(IGNORED), set(REFUSED)]
    assert sum(map(len, kinds)) == len(set().union(*kinds)), "a flag is of two kinds"
    assert set(run) == set().union(*kinds), f"unclassified: {sorted(set(run) - set().union(*kinds))}"
    assert set(analyze) == set(run) | {"--out", "--compare-window-sizes"}
    for flag in IGNORED:
        assert analyze[flag].help.startswith("analyze: accepted and ignored (") and IGNORED[flag] in analyze[flag].help
    for flag in (*HONOURED, *REFUSED):
        assert "accepted and ignored" not in (analyze[flag].help or "")


def test_a_refused_flag_exits_2_with_one_line(tmp_path):
    status, _, stderr = analyze_here([*SMALL, "--out", str(tmp_path), "--summary-json", str(tmp_path / "s.json")])
    assert status == 2
    assert stderr.strip().splitlines() == [
        f"mimo-pipes analyze: error: --summary-json: does not apply to analyze: {REFUSED['--summary-json']}"]


def test_ignored_flags_change_no_figure_and_write_nothing(tmp_path):
    status, _, stderr = analyze_here([*SMALL, "--out", str(tmp_path / "plain")])
    assert status == 0, stderr
    ignored = ["--pad-to-seq-length", "true", "--no-overlap-intra-microbatch-reorder", "--pack-sequences-in-batch", "--pack-pad-multiple", "2",
               "--num-workers", "3", "--exchange-transport", "gloo", "--exchange-image-paths", "--exchange-timeout", "5",
               "--dump-assignments", str(tmp_path / "dumps"), "--save-state", str(tmp_path / "state"), "--tensorboard", str(tmp_path / "tb"),
               "--log-interval", "1"]
    assert {flag for flag in ignored if flag.startswith("--")} == set(IGNORED)
    status, _, stderr = analyze_here([*SMALL, *ignored, "--out", str(tmp_path / "ignored")])
    assert status == 0, stderr
    assert (tmp_path / "ignored" / "analysis.json").read_text() == (tmp_path / "plain" / "analysis.json").read_text()
    assert not any((tmp_path / name).exists() for name in ("dumps", "state", "tb"))


@pytest.fixture(scope="module")
def cut_image_data(tmp_path_factory):
    """Rows whose images have readable headers, one of them cut short after its header (bad only when decoded),
    and one missing (bad either way)."""
    spec, images = write_dataset(tmp_path_factory.mktemp("cut"), "jsonl", 24)
    rows = [json.loads(line) for line in open(spec)]
    Image.new("RGB", (64, 64), (200, 10, 10)).save(images / "whole.png")
    cut = (images / "whole.png").read_bytes()
    (images / "cut.png").write_bytes(cut[: len(cut) // 3])
    cut, missing = [i for i, row in enumerate(rows) if row["images"]][1:3]
    rows[cut]["images"] = ["cut.png"] * len(rows[cut]["images"])
    rows[missing]["images"] = ["missing.png"] * len(rows[missing]["images"])
    with open(spec, "w") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    return ["--dataset", spec, "--image-folder", str(images)], cut, missing


@pytest.mark.parametrize("payload", ["rows", "samples"])
def test_the_payload_decides_which_rows_skip_bad_samples_replaces(cut_image_data, tmp_path, payload):
    """Under rows a row is counted from its headers before it moves (the cut image passes); under samples it is
    processed whole first (the cut image is a bad row): analyze replaces what the run's graph replaces."""
    data, cut, missing = cut_image_data
    flags = [*data, "--micro-batch-size", "4", "--steps", "6", "--seq-length", "512", "--quiet", "--scalable-dp", "--intra-microbatch-reorder",
             "--skip-bad-samples", "--exchange-payload", payload, "--out", str(tmp_path)]
    status, stdout, stderr = analyze_here(flags)
    assert status == 0, stderr
    listed = {int(row) for row in re.findall(r"^  row (\d+): ", stdout, flags=re.MULTILINE)}
    assert listed == ({missing} if payload == "rows" else {cut, missing}), stdout
