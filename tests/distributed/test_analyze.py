"""`mimo-pipes analyze` predicts what a real multi-process `mimo-pipes run` measures, and its cheap token
counts equal what the processor produces."""

from __future__ import annotations

import struct
from collections import defaultdict

import numpy as np
import pytest
from dist_pool import shared_pool
from job_runs import analyze_here, run_and_analyze

from mimo_pipes.analysis.plot import DPI, FIGSIZE_INCHES
from mimo_pipes.analysis.row_counts import UNCOUNTED, count_tokens, processed_counter
from mimo_pipes.data.embedded.builtin_dataset import default_dataset_path
from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.data.sources.saved_folder import open_dataset
from mimo_pipes.errors import SampleError

# Heterogeneous layout (3 ranks): language dp 2 fed by a dp-1 vision module. --steps 6 with window 4
# ends inside a window, so the replay must balance the whole window and keep its first two micro-batches.
COMMON = [
    "--component", "language=dp=2,rank_offset=0", "--component", "images=dp=1,rank_offset=2",
    "--micro-batch-size", "4", "--steps", "6", "--embedded-samples", "48", "--seed", "5", "--quiet",
]
SETTINGS = {
    "window1": ["--reorder-window-size", "1"],
    "window1_across": ["--reorder-window-size", "1", "--reorder-across-microbatches"],
    "window2_across": ["--reorder-window-size", "2", "--reorder-across-microbatches"],
    "window4": ["--reorder-window-size", "4"],
    "window4_across": ["--reorder-window-size", "4", "--reorder-across-microbatches"],
}
REORDER = ["--scalable-dp", "--intra-microbatch-reorder"]
CONTRACT_KEYS = {"dp_size", "steps", "spread_before", "spread_after", "critical_path_before", "critical_path_after"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every setting once through `run` (the per-rank body on the pool's Gloo ranks, dumps) and once through `analyze`."""
    return run_and_analyze(shared_pool(), tmp_path_factory.mktemp("analyze"), SETTINGS, [*COMMON, *REORDER], plots=("window4",))


def _loads_from_dumps(records: list[dict], module: str) -> dict[int, dict[int, int]]:
    loads: dict[int, dict[int, int]] = defaultdict(dict)
    for record in records:
        if record["module"] == module:
            loads[record["step"]][record["dp_rank"]] = sum(record["image_tokens"])
    return loads


def assert_analysis_is_the_summary(analysis, summary):
    """Every module's contract figures equal the run summary's line for it, digit for digit."""
    assert set(analysis) == {"language", "images"}
    for module, figures in analysis.items():
        assert CONTRACT_KEYS <= set(figures)
        line = summary[module]
        # module dp steps samples image_tok spread_before spread_after crit_before crit_after
        assert [figures["dp_size"], figures["steps"], figures["samples"], figures["image_tokens"]] == [int(v) for v in line[1:5]]
        assert [f"{figures['spread_before']:.1f}", f"{figures['spread_after']:.1f}"] == line[5:7]
        assert [figures["critical_path_before"], figures["critical_path_after"]] == [int(v) for v in line[7:9]]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_analyze_predicts_the_run_summary_exactly(runs, name):
    assert_analysis_is_the_summary(runs[name]["analysis"], runs[name]["summary"])


@pytest.mark.parametrize("name", list(SETTINGS))
def test_analyze_matches_the_loads_recomputed_from_the_dumps(runs, name):
    dumps, analysis = runs[name]["dumps"], runs[name]["analysis"]
    for module, figures in analysis.items():
        loads = _loads_from_dumps(dumps, module)
        assert sorted(loads) == list(range(6))
        per_step = [[loads[step][rank] for rank in range(figures["dp_size"])] for step in sorted(loads)]
        assert figures["critical_path_after"] == sum(max(ranks) for ranks in per_step)
        assert figures["spread_after"] == pytest.approx(np.mean([max(ranks) - min(ranks) for ranks in per_step]), abs=0)
        # The what-if of the same setting is the same replay.
        window, across = int(name.removeprefix("window").split("_")[0]), "across" in name
        key = f"across_window_{window}" if across else "per_microbatch"
        if key in figures["what_if"]:
            assert figures["what_if"][key]["critical_path"] == figures["critical_path_after"]


def test_no_reorder_figures_are_the_readers_shards(runs):
    """The run's 'before' is the readers' shards, analyze's no-reorder what-if, also with moves across
    micro-batches when the run consumes whole windows (--steps 6: windows of 1 and 2, not of 4)."""
    for name in ("window1", "window4", "window1_across", "window2_across"):
        for figures in runs[name]["analysis"].values():
            assert figures["what_if"]["no_reorder"] == {"spread": figures["spread_before"], "critical_path": figures["critical_path_before"]}
            bounds = figures["critical_path_lower_bound"]
            assert bounds["per_microbatch"] <= figures["what_if"]["per_microbatch"]["critical_path"]
            assert bounds["across_window_2"] <= figures["what_if"]["across_window_2"]["critical_path"]


def test_analyze_writes_one_png_per_module_of_the_documented_size(runs):
    folder = runs["window4"]["folder"]
    expected = (int(FIGSIZE_INCHES[0] * DPI), int(FIGSIZE_INCHES[1] * DPI))
    for module in ("language", "images"):
        header = (folder / f"{module}.png").read_bytes()[:24]
        assert header[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", header[16:24]) == expected


@pytest.mark.parametrize("seq_length", [2048, 1300, 1200])
def test_counts_from_the_resize_rule_equal_the_processor_output(seq_length):
    """Every row of the embedded data: the header-and-resize-rule counts are the processed counts
    (1300 truncates the text of the samples with the largest images; 1200 rejects them, in both ways alike)."""
    dataset = open_dataset(default_dataset_path(48, seed=0))
    processor = load_processor(default_processor_path(), seq_length)
    slow = processed_counter(processor, processor.image_token_id)
    expected, failing = [], []
    for index in range(len(dataset)):
        try:
            expected.append(slow({**dataset[index], "sample_id": index}))
        except SampleError:
            failing.append(index)
    if failing:
        with pytest.raises(SampleError, match=f"sample {failing[0]}"):
            count_tokens(dataset, processor, use_cache=False)
        return
    image_tokens, real_tokens = count_tokens(dataset, processor, use_cache=False)
    assert list(zip(image_tokens.tolist(), real_tokens.tolist())) == expected
    vision_only, uncounted = count_tokens(dataset, processor, real_tokens=False, use_cache=False)  # no text tokenizing
    assert vision_only.tolist() == image_tokens.tolist() and set(uncounted.tolist()) == {UNCOUNTED}
    assert len(set(image_tokens.tolist())) > 10  # varied data, not a degenerate comparison


def test_counts_are_cached_under_the_dataset_and_processor_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("MIMO_PIPES_CACHE", str(tmp_path))
    dataset = open_dataset(default_dataset_path(48, seed=0))
    first = count_tokens(dataset, load_processor(default_processor_path(), 2048))
    cached = list((tmp_path / "analyze").glob("tokens-*.npz"))
    assert len(cached) == 1
    again = count_tokens(dataset, load_processor(default_processor_path(), 2048))
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    shorter = count_tokens(dataset, load_processor(default_processor_path(), 1350))  # other settings: other entry
    assert len(list((tmp_path / "analyze").glob("tokens-*.npz"))) == 2
    assert shorter[1].max() <= 1350 < first[1].max()


def test_bad_flags_exit_2_with_one_line(tmp_path):
    status, _, stderr = analyze_here(["--out", str(tmp_path), "--micro-batch-size", "3", "--quiet"])
    assert status == 2
    assert stderr.strip().splitlines() == [
        "mimo-pipes analyze: error: --micro-batch-size: 3 is not divisible by the canonical grid size 2 (lcm of the modules' dp sizes)"
    ]
