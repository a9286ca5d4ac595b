"""A time model and two-level balance over real Gloo groups: language dp 4 + images dp 2."""

from __future__ import annotations

from collections import defaultdict

import pytest
from layout_checks import check_fanout, check_invariants
from scenarios_time_model import run_cost_model_graph

from mimo_pipes.samples.cost import placeholder_runs
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes.time_model.model import TimeModel, save_time_model

COMPONENTS = ["language=dp=4", "images=dp=2,rank_offset=4"]
BATCH, STEPS, SEED = 8, 12, 13
MODEL = TimeModel(floor_ps=20_000_000_000, per_image_ps=1_000_000_000, per_patch_ps=5_500_000, per_patch_squared_ps=400)


@pytest.fixture
def pool(gloo_pool):
    return gloo_pool


def _encoder_ns(dataset, sample_id):
    return MODEL.encoder_time_ns(placeholder_runs(dataset[sample_id]["input_ids"], IMAGE_TOKEN_ID))


def _spreads(results, dataset):
    """Mean over steps of (slowest - fastest) rank: images in modelled ns (with the floor), language in real tokens."""
    loads = {"images": defaultdict(dict), "language": defaultdict(dict)}
    for result in filter(None, results):
        for record in result["records"]:
            if result["module"] == "images":
                value = max(MODEL.floor_ns, sum(_encoder_ns(dataset, sid) for sid in record["sample_ids"]))
            else:
                value = sum(record["real_tokens"])
            loads[result["module"]][record["step"]][result["dp_rank"]] = value
    return {module: sum(max(r.values()) - min(r.values()) for r in steps.values()) / len(steps) for module, steps in loads.items()}


def test_modules_agree_on_costs_and_assignment_and_both_spreads_drop(pool, tmp_path):
    path = str(save_time_model(MODEL, tmp_path / "model.json"))
    dataset = SyntheticProcessedDataset(4096, seed=SEED)
    runs = {
        "off": pool.run(run_cost_model_graph, COMPONENTS, steps=STEPS, micro_batch_size=BATCH, seed=SEED, reorder=False),
        "model": pool.run(run_cost_model_graph, COMPONENTS, steps=STEPS, micro_batch_size=BATCH, seed=SEED, time_model=path),
        "two-level": pool.run(
            run_cost_model_graph, COMPONENTS, steps=STEPS, micro_batch_size=BATCH, seed=SEED, time_model=path, two_level=True
        ),
    }
    for name, results in runs.items():
        check_invariants(results, micro_batch_size=BATCH, seed=SEED)  # conservation; both modules, same order
        check_fanout(results, "images")  # encoder replica i feeds language replicas 2i, 2i+1
        costs: dict[str, dict[int, int]] = defaultdict(dict)
        for result in filter(None, results):
            for record in result["records"]:
                costs[result["module"]].update(zip(record["sample_ids"], record["costs"]))
        assert costs["images"] == costs["language"], f"{name}: modules computed different costs"
        if name != "off":  # the default weights (1, 0): the cost is the modelled encoder time in ns
            assert all(cost == _encoder_ns(dataset, sid) for sid, cost in costs["images"].items())
    off, two = _spreads(runs["off"], dataset), _spreads(runs["two-level"], dataset)
    one = _spreads(runs["model"], dataset)
    assert two["images"] < off["images"] and two["language"] < off["language"], (off, two)
    assert one["images"] < off["images"], (off, one)
