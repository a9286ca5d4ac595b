"""The exhaustive split search's pure parts, and its CPU smoke run (measure, then validate afresh)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import split_search_gpu  # noqa: E402 - benchmarks folder put on the path just above


@settings(max_examples=30, deadline=None)
@given(parts=st.integers(1, 4), size=st.integers(1, 3))
def test_equal_splits_are_every_partition_into_equal_groups_once(parts, size):
    items = tuple(range(parts * size))
    splits = list(split_search_gpu.equal_splits(items, parts))
    expected = math.factorial(parts * size) // (math.factorial(size) ** parts * math.factorial(parts))
    assert len(splits) == expected
    canonical = {tuple(sorted(tuple(sorted(g)) for g in split)) for split in splits}
    assert len(canonical) == expected  # no split twice, in any group order
    for split in splits:
        assert len(split) == parts and all(len(g) == size for g in split)
        assert sorted(i for g in split for i in g) == list(items)


@settings(max_examples=40, deadline=None)
@given(parts=st.integers(1, 3), size=st.integers(1, 3), weights=st.lists(st.integers(0, 50), min_size=9, max_size=9),
       floor=st.integers(0, 60))
def test_branch_and_bound_finds_the_brute_force_best_split(parts, size, weights, floor):
    items = tuple(range(parts * size))

    def cost_of(group):
        return float(max(floor, sum(weights[i] for i in group)))

    brute = min((max(map(cost_of, split)), sum(map(cost_of, split))) for split in split_search_gpu.equal_splits(items, parts))
    assert split_search_gpu.best_split_by(cost_of, items, parts) == brute


def test_keys_name_the_images_a_rank_runs():
    samples = [{"grid": [[1, 4, 6]]}, {"grid": []}, {"grid": [[1, 2, 2], [1, 8, 8]]}]
    assert split_search_gpu.key_of(samples, (0, 1)) == "1,4,6"
    assert split_search_gpu.key_of(samples, (2, 0)) == split_search_gpu.key_of(samples, (0, 2)) == "1,2,2;1,4,6;1,8,8"
    assert split_search_gpu.grids_of("1,2,2;1,4,6") == [[1, 2, 2], [1, 4, 6]] and split_search_gpu.grids_of("") == []


@pytest.mark.launch  # a benchmark script run end to end
def test_cpu_smoke_measures_every_split_and_validates_the_chosen_ones(tmp_path):
    measured, validated = tmp_path / "measured", tmp_path / "validated"
    assert split_search_gpu.main(["--device", "cpu", "--smoke", "--layouts", "4x8", "--steps", "1", "--out", str(measured)]) == 0
    body = json.loads((measured / "results.json").read_text())
    assert body["steps_timed"] == {"4x8": 1} and all(t >= 0 for t in body["tables"]["4x8"].values())
    result = json.loads((measured / "evaluation.json").read_text())[0]
    best = result["methods"]["best"]["slowest_ms"]
    # The best split is the minimum over every split of the same table, so no planner beats it there.
    assert all(best <= m["slowest_ms"] + 1e-9 for m in result["methods"].values())
    assert split_search_gpu.main(["--device", "cpu", "--smoke", "--layouts", "4x8", "--from-results", str(measured / "results.json"),
                                  "--validate", "--repeats", "1", "--out", str(validated)]) == 0
    fresh = json.loads((validated / "validation.json").read_text())["timings"]["4x8"]
    config = split_search_gpu.PipelineConfig
    samples = split_search_gpu.processed_samples(16, config.seq_length, lambda line: None)
    model = split_search_gpu.TimeModel(**{k: v for k, v in body["model"].items() if k not in ("format", "version")})
    chosen = split_search_gpu.chosen_splits(samples, body["tables"]["4x8"], model, 4, 8, 1, config.seed)
    assert set(fresh) == {k for per_step in chosen.values() for ks in per_step for k in ks}
