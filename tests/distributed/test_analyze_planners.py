"""`mimo-pipes analyze` replays a calibrated time model (--reorder-cost-model) and two-level balance
(--reorder-two-level) exactly as a real multi-process `mimo-pipes run` with the same flags consumes them."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from dist_pool import shared_pool
from job_runs import analyze_here, run_and_analyze
from test_analyze import REORDER, assert_analysis_is_the_summary

from mimo_pipes.analysis.row_counts import count_rows
from mimo_pipes.data.embedded.builtin_dataset import default_dataset_path
from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.data.sources.saved_folder import open_dataset
from mimo_pipes.parallel.sharding import global_microbatch_indices
from mimo_pipes.samples.cost import placeholder_runs, real_token_count
from mimo_pipes.time_model.model import TimeModel, save_time_model

MODEL = TimeModel(floor_ps=20_000_000_000, per_image_ps=1_000_000_000, per_patch_ps=5_500_000, per_patch_squared_ps=400)
SAMPLES, BATCH, STEPS, SEED, SEQ = 64, 8, 8, 5, 2048
COMMON = ["--micro-batch-size", str(BATCH), "--steps", str(STEPS), "--embedded-samples", str(SAMPLES), "--seed", str(SEED), "--quiet"]
TWO_BY_TWO = ["--component", "language=dp=2,rank_offset=0", "--component", "images=dp=2,rank_offset=2"]
TWO_BY_ONE = ["--component", "language=dp=2,rank_offset=0", "--component", "images=dp=1,rank_offset=2"]
MODEL_FLAG = ["--reorder-cost-model", "{model}"]
SETTINGS = {
    "model_window1": [*TWO_BY_TWO, *MODEL_FLAG],
    "model_window4_across": [*TWO_BY_TWO, *MODEL_FLAG, "--reorder-window-size", "4", "--reorder-across-microbatches"],
    "two_level_model_window2_across": [*TWO_BY_ONE, *MODEL_FLAG, "--reorder-two-level", "--reorder-window-size", "2",
                                       "--reorder-across-microbatches"],
    "two_level_window1": [*TWO_BY_ONE, "--reorder-two-level"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every setting once through `run` (the per-rank body on the pool's Gloo ranks, dumps) and once through `analyze`."""
    root = tmp_path_factory.mktemp("analyze_planners")
    model = str(save_time_model(MODEL, root / "model.json"))
    settings = {name: [model if flag == "{model}" else flag for flag in flags] for name, flags in SETTINGS.items()}
    return run_and_analyze(shared_pool(), root, settings, [*COMMON, *REORDER])


@pytest.fixture(scope="module")
def processed():
    """Per dataset row, from the processor run on it as the graph runs it: (modelled encoder ns, real tokens)."""
    dataset = open_dataset(default_dataset_path(SAMPLES, seed=0))
    processor = load_processor(default_processor_path(), SEQ)
    encoder, real = [], []
    for index in range(len(dataset)):
        sample = processor({**dataset[index], "sample_id": index})
        encoder.append(MODEL.encoder_time_ns(placeholder_runs(sample["input_ids"], processor.placeholder_ids)))
        real.append(real_token_count(sample["attention_mask"]))
    return np.array(encoder, dtype=np.int64), np.array(real, dtype=np.int64)


def _figures(loads_after: dict[int, list[int]], loads_before: dict[int, list[int]], floor: int = 0) -> dict[str, float | int]:
    after = np.maximum(np.array([loads_after[step] for step in sorted(loads_after)]), floor)
    before = np.maximum(np.array([loads_before[step] for step in sorted(loads_before)]), floor)
    return {
        "spread_before": float((before.max(axis=1) - before.min(axis=1)).mean()),
        "spread_after": float((after.max(axis=1) - after.min(axis=1)).mean()),
        "critical_path_before": int(before.max(axis=1).sum()),
        "critical_path_after": int(after.max(axis=1).sum()),
    }


def _recomputed(dumps: list[dict], module: str, dp_size: int, values: np.ndarray, floor: int = 0) -> dict[str, float | int]:
    """After: what each rank consumed (its dump); before: the readers' shards (reordering off), all steps whole windows."""
    after: dict[int, list[int]] = defaultdict(lambda: [0] * dp_size)
    for record in dumps:
        if record["module"] == module:
            after[record["step"]][record["dp_rank"]] = int(values[record["sample_ids"]].sum())
    before = {}
    for step in after:
        rows = global_microbatch_indices(step, SAMPLES, BATCH, SEED, True).reshape(dp_size, -1)
        before[step] = [int(values[shard].sum()) for shard in rows]
    assert sorted(after) == list(range(STEPS))
    return _figures(after, before, floor)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_analyze_replays_the_run_summary_exactly(runs, name):
    analysis = runs[name]["analysis"]
    assert_analysis_is_the_summary(analysis, runs[name]["summary"])
    for figures in analysis.values():
        # Whole windows: "before" is the readers' shards, as with reordering off.
        assert figures["what_if"]["no_reorder"] == {"spread": figures["spread_before"], "critical_path": figures["critical_path_before"]}


@pytest.mark.parametrize("name", [name for name in SETTINGS if "model" in name])
def test_modelled_encoder_time_is_what_the_run_consumed(runs, processed, name):
    encoder_ns, _ = processed
    figures = runs[name]["analysis"]["images"]["modelled_encoder_time"]
    dp_size = runs[name]["analysis"]["images"]["dp_size"]
    assert figures["unit"] == "ns of modelled encoder time" and figures["floor"] == MODEL.floor_ns
    expected = _recomputed(runs[name]["dumps"], "images", dp_size, encoder_ns, MODEL.floor_ns)
    assert {key: figures[key] for key in expected} == pytest.approx(expected, abs=0)
    assert "modelled_encoder_time" not in runs[name]["analysis"]["language"]  # the language ranks run no encoder
    images = next(line.split() for line in runs[name]["analyze_stdout"].splitlines() if line.startswith("images "))
    assert images[2:4] == ["modelled", "ms"]  # the table shows the encoder in modelled ms
    assert images[8:10] == [f"{figures['critical_path_before'] / 1e6:,.1f}", f"{figures['critical_path_after'] / 1e6:,.1f}"]
    if dp_size > 1:
        assert figures["critical_path_after"] < figures["critical_path_before"]


@pytest.mark.parametrize("name", [name for name in SETTINGS if "two_level" in name])
def test_two_level_reports_both_modules_in_real_tokens(runs, processed, name):
    _, real_tokens = processed
    analysis = runs[name]["analysis"]
    for module, figures in analysis.items():
        expected = _recomputed(runs[name]["dumps"], module, figures["dp_size"], real_tokens)
        block = figures["real_tokens"]
        assert {key: block[key] for key in expected} == pytest.approx(expected, abs=0), module
        # Its what-ifs: the readers' shards as before, the given window's replay as after, bounds below both.
        assert block["what_if"]["no_reorder"] == {"spread": block["spread_before"], "critical_path": block["critical_path_before"]}
        given = "per_microbatch" if "window1" in name else "across_window_2"
        assert block["what_if"][given]["critical_path"] == block["critical_path_after"]
        assert all(bound <= block["what_if"][key]["critical_path"] for key, bound in block["critical_path_lower_bound"].items())
    language = analysis["language"]["real_tokens"]
    assert language["spread_after"] < language["spread_before"]  # the second level splits each group on real tokens


def test_runs_from_image_sizes_price_each_row_as_processing_does(processed):
    """analyze's placeholder runs come from image headers and the processor's token layout, not pixels."""
    dataset = open_dataset(default_dataset_path(SAMPLES, seed=0))
    counts = count_rows(dataset, load_processor(default_processor_path(), SEQ), runs=True, use_cache=False)
    assert counts.encoder_costs(MODEL).tolist() == processed[0].tolist()
    assert counts.runs_per_row is not None and counts.runs_per_row.max() > 1  # rows with several images are in the data
    without = count_rows(dataset, load_processor(default_processor_path(), SEQ), use_cache=False)
    assert without.image_tokens.tolist() == counts.image_tokens.tolist()
    with pytest.raises(ValueError, match="runs=True"):
        without.encoder_costs(MODEL)


def test_a_time_model_for_other_patches_is_refused_by_name(tmp_path):
    path = save_time_model(TimeModel(per_patch_ps=1000, merge_size=3), tmp_path / "model.json")
    status, _, stderr = analyze_here(["--out", str(tmp_path / "out"), *REORDER, "--reorder-cost-model", str(path), "--quiet"])
    assert status == 2
    errors = [line for line in stderr.strip().splitlines() if "error" in line]  # after the data's progress line
    assert len(errors) == 1 and errors[0].startswith("mimo-pipes analyze: error: --reorder-cost-model: "), errors
    assert "merge_size: 3 in the file, but the processor uses 2" in errors[0]
