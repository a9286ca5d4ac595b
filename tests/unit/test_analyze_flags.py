"""analyze takes run's command line: every flag of run means to analyze what it means to run, or is
accepted and ignored (it moves no sample, and analyze's help says so), or is refused as not applying."""

from __future__ import annotations

import contextlib
import io
import json
import re
import struct
import zlib
from pathlib import Path

import pytest
from fresh_cache import fresh_cache
from job_runs import analyze_here
from PIL import Image
from real_data import write_dataset

from mimo_pipes.cli.commands.analyze_cmd import HONOURED, IGNORED, REFUSED
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
    assert set(analyze) == set(run) | {"--out", "--compare-window-sizes", "--no-plots"}
    for flag in IGNORED:
        assert analyze[flag].help.startswith("analyze: accepted and ignored (") and IGNORED[flag] in analyze[flag].help
    for flag in (*HONOURED, *REFUSED):
        assert "accepted and ignored" not in (analyze[flag].help or "")


def test_a_refused_flag_exits_2_with_one_line(tmp_path):
    status, _, stderr = analyze_here([*SMALL, "--out", str(tmp_path), "--summary-json", str(tmp_path / "s.json")])
    assert status == 2
    assert stderr.strip().splitlines() == [
        f"mimo-pipes analyze: error: --summary-json: does not apply to analyze: {REFUSED['--summary-json']}"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple[Path, str]:
    """analyze SMALL --no-plots, run once for the tests that compare another run with it: (its --out, its stdout)."""
    out = tmp_path_factory.mktemp("plain")
    status, stdout, stderr = analyze_here([*SMALL, "--out", str(out)])
    assert status == 0, stderr
    return out, stdout


def test_ignored_flags_change_no_figure_and_write_nothing(tmp_path, plain):
    ignored = ["--pad-to-seq-length", "true", "--no-overlap-intra-microbatch-reorder", "--pack-sequences-in-batch", "--pack-pad-multiple", "2",
               "--num-workers", "3", "--processing", "thread", "--exchange-transport", "gloo", "--exchange-image-paths",
               "--exchange-timeout", "5", "--read-ahead", "0",
               "--dump-assignments", str(tmp_path / "dumps"), "--save-state", str(tmp_path / "state"), "--tensorboard", str(tmp_path / "tb"),
               "--log-interval", "1"]
    assert {flag for flag in ignored if flag.startswith("--")} == set(IGNORED)
    status, _, stderr = analyze_here([*SMALL, *ignored, "--out", str(tmp_path / "ignored")])
    assert status == 0, stderr
    assert (tmp_path / "ignored" / "analysis.json").read_text() == (plain[0] / "analysis.json").read_text()
    assert not any((tmp_path / name).exists() for name in ("dumps", "state", "tb"))


def _run_here(argv: list[str]) -> tuple[int, str]:
    """``mimo-pipes run ARGV`` in this process, for settings it refuses before any rank starts: (status, stderr)."""
    from mimo_pipes.cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(["run", *argv])
    return status, stderr.getvalue()


def _ignored_flag_cases(folder) -> list[list[str]]:
    (folder / "a-file").write_text("")
    (folder / "locked").mkdir()
    cases = [[flag, str(folder / "a-file")] for flag in ("--save-state", "--dump-assignments", "--tensorboard")]
    cases += [[flag, str(folder / "a-file" / "below")] for flag in ("--save-state", "--dump-assignments", "--tensorboard")]
    cases += [["--stop-after", "2"], ["--log-interval", "-1"], ["--exchange-timeout", "0"], ["--read-ahead", "-1"], ["--pack-pad-multiple", "0"],
              ["--num-workers", "-2"], ["--exchange-transport", "udp"], ["--pad-to-seq-length", "false"]]
    import torch

    if not torch.cuda.is_available():  # nccl needs a GPU per rank: refused here by run, so by analyze
        cases.append(["--exchange-transport", "nccl", "--no-overlap-intra-microbatch-reorder"])
    return cases


def test_the_ignored_flags_checks_refuse_what_run_refuses(tmp_path):
    """A flag analyze ignores is still checked as run checks it (output folders, the transport against this
    machine, ...): the same one line naming it, exit 2."""
    for flags in _ignored_flag_cases(tmp_path):
        run_status, run_error = _run_here([*SMALL, *flags])
        status, _, error = analyze_here([*SMALL, *flags, "--out", str(tmp_path / "out")])
        assert run_status == status == 2, (flags, run_error, error)
        refusal = [line for line in error.splitlines() if line.startswith("mimo-pipes analyze: error: ")]
        assert refusal == [line.replace("mimo-pipes run", "mimo-pipes analyze") for line in run_error.splitlines()
                           if line.startswith("mimo-pipes run: error: ")], flags
        assert refusal[0].split(": ")[2] == flags[0], refusal
    assert not (tmp_path / "out").exists()


def test_a_single_pass_that_ends_early_says_so_as_the_run_does(tmp_path):
    status, stdout, stderr = analyze_here(["--embedded-samples", "22", "--micro-batch-size", "4", "--steps", "9", "--dataloader-type", "single",
                                           "--quiet", "--out", str(tmp_path)])
    assert status == 0, stderr
    assert "the data ended after 5 micro-batches, before the 9 asked for (--steps)" in stdout.splitlines()


def _garbled_png(whole: bytes) -> bytes:
    """``whole`` with its pixel data scrambled and every chunk's CRC made right: framed whole, undecodable."""
    out, position = bytearray(whole[:8]), 8
    while position < len(whole):
        length, kind = struct.unpack(">I4s", whole[position : position + 8])
        body = whole[position + 8 : position + 8 + length]
        if kind == b"IDAT":
            body = body[:2] + bytes(b ^ 0x5A for b in body[2:])
        out += struct.pack(">I4s", length, kind) + body + struct.pack(">I", zlib.crc32(kind + body))
        position += 12 + length
    return bytes(out)


@pytest.fixture(scope="module")
def cut_image_data(tmp_path_factory):
    """Rows whose images have readable headers: one cut short after its header, one framed whole whose
    pixels cannot be decoded, and one missing."""
    spec, images = write_dataset(tmp_path_factory.mktemp("cut"), "jsonl", 24)
    rows = [json.loads(line) for line in open(spec)]
    Image.new("RGB", (64, 64), (200, 10, 10)).save(images / "whole.png")
    whole = (images / "whole.png").read_bytes()
    (images / "cut.png").write_bytes(whole[: len(whole) // 3])
    (images / "garbled.png").write_bytes(_garbled_png(whole))
    cut, missing, garbled = [i for i, row in enumerate(rows) if row["images"]][1:4]
    for row, name in ((cut, "cut.png"), (missing, "missing.png"), (garbled, "garbled.png")):
        rows[row]["images"] = [name] * len(rows[row]["images"])
    with open(spec, "w") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    return ["--dataset", spec, "--image-folder", str(images)], cut, missing, garbled


@pytest.mark.parametrize("payload", ["rows", "samples"])
def test_the_payload_decides_which_rows_skip_bad_samples_replaces(cut_image_data, tmp_path, payload):
    """Under rows a row is counted from its headers, its image files checked whole, before it moves (the cut
    image is replaced; the garbled one passes and is masked where it is processed); under samples it is
    processed whole first (both are replaced): analyze replaces and masks what the run's graph does."""
    data, cut, missing, garbled = cut_image_data
    flags = [*data, "--micro-batch-size", "4", "--steps", "6", "--seq-length", "512", "--quiet", "--scalable-dp", "--intra-microbatch-reorder",
             "--skip-bad-samples", "--exchange-payload", payload, "--out", str(tmp_path)]
    status, stdout, stderr = analyze_here(flags)
    assert status == 0, stderr
    lines = stdout.splitlines()
    skip = next(i for i, line in enumerate(lines) if line.startswith("skipped "))
    listed = {int(row) for row in re.findall(r"^  row (\d+): ", "\n".join(lines[skip + 1 : skip + 4]), flags=re.MULTILINE)}
    assert listed == ({cut, missing} if payload == "rows" else {cut, missing, garbled}), stdout
    assert f"  row {cut}: image 0 cannot be decoded: it is a PNG cut short" in stdout if payload == "rows" else True
    masked = [line for line in lines if line.startswith("masked ")]
    if payload == "rows":  # the run prints this line under rows only
        assert masked and masked[0].startswith("masked 1 row(s) that failed after the exchange") and masked[0].endswith(f"rows {garbled}")
        assert lines[lines.index(masked[0]) + 1].startswith(f"  row {garbled}: image 0 (garbled.png) cannot be decoded: ")
    else:
        assert not masked


def test_counts_are_not_reused_from_another_image_folder(tmp_path, monkeypatch):
    """The same rows under two image folders whose files differ in size: the cached counts of one folder are
    not the other's (nor are its bad rows and their reasons, which name the folder)."""
    monkeypatch.setenv("MIMO_PIPES_CACHE", str(fresh_cache(tmp_path / "cache")))  # no counts cached yet
    spec, images = write_dataset(tmp_path / "data", "jsonl", 16)
    larger = tmp_path / "larger"
    larger.mkdir()
    for image in images.iterdir():
        Image.new("RGB", (224, 224)).save(larger / image.name)
    flags = ["--dataset", spec, "--micro-batch-size", "4", "--steps", "4", "--seq-length", "1024", "--quiet"]
    tokens = []
    for folder in (images, larger, images):
        status, _, stderr = analyze_here([*flags, "--image-folder", str(folder), "--out", str(tmp_path / "out" / folder.name)])
        assert status == 0, stderr
        tokens.append(json.loads((tmp_path / "out" / folder.name / "analysis.json").read_text())["images"]["image_tokens"])
    assert tokens[0] == tokens[2] != tokens[1]


def test_an_undecodable_image_reason_reads_alike_everywhere():
    """A reason holds no object address (PIL names the stream it read): the run's ranks and analyze print the same line."""
    from mimo_pipes.data.processing.media import open_image
    from mimo_pipes.errors import SampleError, row_reason

    reasons = set()
    for _ in range(2):
        with pytest.raises(SampleError) as caught:
            open_image(b"not an image at all", None, 7, "image 0")
        reasons.add(row_reason(caught.value))
    assert reasons == {"image 0 cannot be decoded: cannot identify image file"}


def test_what_ifs_a_run_would_refuse_are_left_out_and_said(tmp_path):
    # With --global-batch-size a window across micro-batches must divide the micro-batches of a global batch:
    # a what-if of another window is one no run can have, so it is neither compared nor drawn.
    args = [*SMALL, "--reorder-window-size", "3", "--global-batch-size", "12", "--compare-window-sizes", "1,2,3,4,6"]
    status, _, stderr = analyze_here([*args, "--out", str(tmp_path)])
    assert status == 0, stderr
    assert ("mimo-pipes analyze: across 2, 4, 6 left out: with --global-batch-size 12 a run refuses windows that do not divide "
            "the 3 micro-batches of a global batch") in stderr.splitlines()
    analysis = json.loads((tmp_path / "analysis.json").read_text())
    for module in analysis.values():
        assert set(module["what_if"]) == {"no_reorder", "per_microbatch", "across_window_1", "across_window_3"}


def test_no_plots_writes_the_same_json_and_no_png(tmp_path, monkeypatch, plain):
    # Each module's figure is built as ever; only its pixels are not: saving the figure writes a stand-in file
    # (rendering and the PNG's documented size are test_analysis_plot's write_plots test, drawn once there).
    from matplotlib.figure import Figure

    monkeypatch.setattr(Figure, "savefig", lambda figure, path, **_: Path(path).write_bytes(b"\x89PNG stand-in"))
    status, plotted, stderr = analyze_here([*SMALL, "--out", str(tmp_path / "plots")], plots=True)
    assert status == 0, stderr
    folder, stdout = plain  # the same flags with --no-plots
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["analysis.json", "images.png", "language.png"]
    assert sorted(p.name for p in folder.iterdir()) == ["analysis.json"]
    assert (folder / "analysis.json").read_text() == (tmp_path / "plots" / "analysis.json").read_text()
    assert stdout.splitlines()[-1] == f"wrote {folder / 'analysis.json'}"
    assert plotted.splitlines()[-1].endswith("images.png")
