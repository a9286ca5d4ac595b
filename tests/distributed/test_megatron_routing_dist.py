"""Heterogeneous DP through megatron-core's bridge (fan-out), on real Gloo ranks laid out from ``HyperCommGrid``
objects: every encoder rank's micro-batch holds ``input_ids`` (one row per sample, never packed), and the rows
megatron-core's routing rule sends to each language peer are, by sample id and placeholder count, exactly the
samples that peer holds, in order, with reordering, windows across micro-batches, sequence packing, TP or PP on
the language side, and after an elastic resume. Then megatron-core's own BridgeCommunicator carries a tensor
built from each encoder rank's micro-batch to the language ranks that hold those samples."""

from __future__ import annotations

import pytest
from scenarios_megatron_routing import bridge_delivery, grid_micro_batches

from mimo_pipes.megatron.routing import peer_row_counts
from mimo_pipes.parallel.topology import fanout_targets

POOL_PRELOAD = ("megatron.core.hyper_comm_grid",)  # every rank's grids (tests/distributed/conftest.py)

# name: (modules as grids, micro-batch size); images first, then language on the following ranks
LAYOUTS = {
    "img1-lang2": ({"images": {"offset": 0, "dp": 1}, "language": {"offset": 1, "dp": 2}}, 8),
    "img2-lang4": ({"images": {"offset": 0, "dp": 2}, "language": {"offset": 2, "dp": 4}}, 8),
    "img1-lang-tp2-dp2": ({"images": {"offset": 0, "dp": 1}, "language": {"offset": 1, "tp": 2, "dp": 2}}, 8),
    "img1-lang-pp2-dp2": ({"images": {"offset": 0, "dp": 1}, "language": {"offset": 1, "pp": 2, "dp": 2}}, 4),
}
# megatron-core's default dimension order (dp inside pp): the pipeline places the language ranks as the grid does
MEGATRON_ORDER = {"images": {"offset": 0, "dp": 1}, "language": {"offset": 1, "pp": 2, "dp": 2, "dims": ("tp", "cp", "dp", "pp")}}
STREAMS = {
    "reorder": {"window_size": 1},
    "window-across": {"window_size": 2, "across": True},
    "packed": {"window_size": 2, "across": True, "pack": True},
}


def check_fan_out(results: list[dict], where: str, packed: bool = False) -> int:
    """Every encoder rank's micro-batch, step by step, against its language peers' (every TP/PP rank of a replica
    alike): the same samples in order, each with the same placeholder count, and the rule's rows per peer equal
    to the placeholders each peer holds. Returns the micro-batches checked."""
    language = [r for r in results if r["module"] == "language"]
    encoders = [r for r in results if r["module"] != "language"]
    assert encoders and language, where
    assert all(r["dp_rank"] == r["grid_dp_rank"] for r in results), f"{where}: a DP rank differs from its grid's"
    replicas: dict[tuple[int, int], dict] = {}
    for result in language:
        for record in result["records"]:
            assert record["packed"] == packed and (record["rows"] == 1 or not packed), f"{where}: language packed {record['packed']}"
            first = replicas.setdefault((record["step"], result["dp_rank"]), record)
            assert (first["sample_ids"], first["counts"]) == (record["sample_ids"], record["counts"]), (
                f"{where}: the ranks of language replica {result['dp_rank']} disagree at step {record['step']}")
    checked = 0
    for encoder in encoders:
        assert encoder["layout_module"] == encoder["module"] and "attention_mask" not in encoder["records"][0]["keys"]
        peers = fanout_targets(encoder["dp_rank"], encoder["dp_size"], language[0]["dp_size"])
        for record in encoder["records"]:
            at = f"{where}: {encoder['module']} dp rank {encoder['dp_rank']}, step {record['step']}"
            assert "input_ids" in record["keys"] and not record["packed"] and record["rows"] == len(record["sample_ids"]), at
            held = [replicas[(record["step"], peer)] for peer in peers]
            assert record["sample_ids"] == [i for peer in held for i in peer["sample_ids"]], at
            assert record["counts"] == [c for peer in held for c in peer["counts"]], at
            assert peer_row_counts(record["counts"], sum(record["counts"]), len(peers)) == [sum(p["counts"]) for p in held], at
            checked += 1
    return checked


@pytest.mark.parametrize("stream", sorted(STREAMS))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_language_peer_receives_the_rows_of_its_own_samples(gloo_pool, layout, stream):
    modules, batch = LAYOUTS[layout]
    results = [r for r in gloo_pool.run(grid_micro_batches, modules, steps=4, micro_batch_size=batch, seed=11, **STREAMS[stream])
               if r is not None]
    assert check_fan_out(results, f"{layout}, {stream}", packed=STREAMS[stream].get("pack", False)) == 4 * modules["images"]["dp"]
    uneven = {tuple(record["counts"]) for r in results if r["module"] == "images" for record in r["records"]}
    assert any(len(set(counts)) > 1 for counts in uneven), "the data must hold samples of different image sizes"


def test_a_language_grid_in_megatrons_default_order_routes_alike(gloo_pool):
    results = [r for r in gloo_pool.run(grid_micro_batches, MEGATRON_ORDER, steps=4, micro_batch_size=4, seed=11, window_size=2, across=True)
               if r is not None]
    assert check_fan_out(results, "img1-lang-pp2-dp2, dims tp-cp-dp-pp") == 4
    replicas = {(r["dp_rank"], r["pp_rank"]) for r in results if r["module"] == "language"}
    assert replicas == {(0, 0), (1, 0), (0, 1), (1, 1)}


def test_after_an_elastic_resume_the_routing_holds(gloo_pool):
    """Two micro-batches on images dp 1 + language dp 2, then the stream continues from Megatron's count on
    images dp 2 + language dp 4: the new layout routes right and continues the same global stream."""
    before, _ = LAYOUTS["img1-lang2"]
    after, batch = LAYOUTS["img2-lang4"]
    kwargs = {"micro_batch_size": batch, "seed": 11, "window_size": 2, "across": True}
    resumed = [r for r in gloo_pool.run(grid_micro_batches, after, steps=2, resume_from=before, resume_at=2, **kwargs) if r is not None]
    whole = [r for r in gloo_pool.run(grid_micro_batches, after, steps=4, **kwargs) if r is not None]
    assert check_fan_out(resumed, "resumed on img2-lang4") == 4
    assert {record["step"] for r in resumed for record in r["records"]} == {2, 3}

    by_step: dict[int, list[int]] = {}
    for result in resumed:
        if result["module"] == "images":
            for record in result["records"]:
                by_step.setdefault(record["step"], []).extend(record["sample_ids"])
    expected: dict[int, list[int]] = {}
    for result in whole:
        if result["module"] == "images":
            for record in result["records"]:
                if record["step"] >= 2:
                    expected.setdefault(record["step"], []).extend(record["sample_ids"])
    assert {s: sorted(v) for s, v in by_step.items()} == {s: sorted(v) for s, v in expected.items()}


@pytest.mark.parametrize("layout", ["img1-lang2", "img2-lang4", "img1-lang-tp2-dp2"])
def test_megatron_cores_bridge_delivers_each_encoder_ranks_samples_to_their_language_ranks(gloo_pool, layout):
    modules, batch = LAYOUTS[layout]
    results = [r for r in gloo_pool.run(bridge_delivery, modules, steps=3, micro_batch_size=batch, seed=11, window_size=1)
               if r is not None]
    language = [r for r in results if r["module"] == "language"]
    assert len(language) == sum(1 for r in results) - modules["images"]["dp"]
    for result in language:
        assert len(result["received"]) == 3
        for got in result["received"]:
            where = f"{layout}: language dp rank {result['dp_rank']} tp rank {result['tp_rank']}, step {got['step']}"
            assert got["batch_first"] == got["own"], where
            if result["split_sizes"]:  # megatron-core 0.19: the flat output, cut by the sizes MimoModel attached
                assert got["flat_rows"] == [i for i, count in zip(got["own"], got["own_counts"]) for _ in range(count)], where
