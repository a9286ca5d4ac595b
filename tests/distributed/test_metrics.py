"""Exchange metrics: the pure arithmetic, DP 1 without a collective, the TensorBoard sink, and the timing hook
over real Gloo ranks (one record per window; bytes sent by all ranks == bytes received by all ranks)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scenarios_metrics import cumulative_after_resume, run_observed
from test_metrics_cli import read_scalars

from mimo_pipes.balance import balance_window
from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.exchange import RankLayout
from mimo_pipes.observe.metrics import MetricsAccumulator, load_figures, rank_loads, scalars, window_metrics
from mimo_pipes.observe.observer import PHASES, ExchangeRecord
from mimo_pipes.observe.tensorboard_sink import TensorBoardSink
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline


def record_for(costs, tokens, dp_size, grid_size, across, sequence=0):
    assignment = balance_window(costs, grid_size, across_microbatches=across)
    return ExchangeRecord(sequence, 0, 0, dp_size, grid_size, across, costs=costs, image_tokens=tokens,
                          packed_bytes=[[100 + c for c in row] for row in costs], assignment=assignment)


windows = st.integers(1, 3).flatmap(lambda count: st.sampled_from([(1, 2), (2, 2), (2, 4), (4, 4), (1, 4)]).flatmap(
    lambda layout: st.tuples(
        st.just(layout),
        st.lists(st.lists(st.integers(0, 5000), min_size=layout[1] * 2, max_size=layout[1] * 2), min_size=count, max_size=count),
        st.booleans(),
    )))


@settings(max_examples=60, deadline=None)
@given(windows)
def test_window_metrics_conserve_load_and_respect_the_bound(case):
    (dp_size, grid_size), costs, across = case
    tokens = [[c // 3 for c in row] for row in costs]
    figures = window_metrics(record_for(costs, tokens, dp_size, grid_size, across))
    for quantity, values in (("cost", costs), ("image_tokens", tokens)):
        total = sum(map(sum, values))
        for when in ("before", "after"):
            prefix = f"{quantity}/{when}"
            assert sum(figures[f"{prefix}/per_rank"]) == total  # nothing lost or made
            assert figures[f"{prefix}/spread"] == pytest.approx(figures[f"{prefix}/max"] - figures[f"{prefix}/min"])
            assert figures[f"{prefix}/mean"] == pytest.approx(total / (len(values) * dp_size))
            assert figures[f"{prefix}/critical_path"] >= figures[f"{quantity}/critical_path_lower_bound"]
            assert figures[f"{prefix}/critical_path"] == pytest.approx(figures[f"{prefix}/max"] * len(values))
    if dp_size == 1:
        assert figures["moved/samples"] == figures["moved/bytes"] == 0


def test_rank_loads_follow_the_readers_and_the_assignment():
    values = [[5, 1, 2, 8]]
    assert rank_loads(values, None, 2, 2) == [[6, 10]]
    assert rank_loads(values, [[[0, 2], [1, 3]]], 2, 2) == [[7, 9]]
    assert rank_loads(values, [[[3], [0], [1], [2]]], 2, 4) == [[13, 3]]  # slots 0-1 on rank 0
    figures = load_figures([[6, 10], [4, 4]])
    assert figures["per_rank"] == [10, 14] and figures["critical_path"] == 14
    assert figures["max"] == 7 and figures["min"] == 5 and figures["spread"] == 2 and figures["mean"] == 6


def test_moves_count_what_changes_rank():
    record = record_for([[9, 9, 1, 1]], [[9, 9, 1, 1]], 2, 2, False)
    figures = window_metrics(record)
    assert figures["image_tokens/before/per_rank"] == [18, 2]
    assert figures["image_tokens/after/per_rank"] == [10, 10]
    assert figures["moved/samples"] == 2 and figures["moved/bytes"] == 109 + 101


def test_cumulative_figures_add_up_over_windows():
    accumulator = MetricsAccumulator()
    first = window_metrics(record_for([[9, 9, 1, 1]], [[9, 9, 1, 1]], 2, 2, False))
    second = window_metrics(record_for([[4, 0, 0, 4], [2, 2, 2, 2]], [[4, 0, 0, 4], [2, 2, 2, 2]], 2, 2, False, 1))
    accumulator.add(first, 0.5)
    out = accumulator.add(second, 0.25)
    assert out["cumulative/windows"] == 2 and out["cumulative/microbatches"] == 3
    assert out["time/wait_s"] == 0.25 and out["cumulative/time/wait_s"] == 0.75
    assert out["cumulative/image_tokens/before/critical_path"] == 18 + 4 + 4
    assert out["cumulative/image_tokens/before/spread"] == pytest.approx((16 + 0 + 0) / 3)
    assert out["cumulative/image_tokens/before/per_rank"] == [18 + 4 + 4, 2 + 4 + 4]
    assert out["cumulative/moved/samples"] == first["moved/samples"] + second["moved/samples"]
    flat = scalars(out)
    assert flat["cumulative/image_tokens/before/per_rank/1"] == 10.0


def dp1_loader(window: int, collect: bool = True):
    config = PipelineConfig(components=("language=dp=1",), micro_batch_size=4, seq_length=4096, num_workers=1,
                            reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=window))
    loader = pipeline(SyntheticProcessedDataset(64, seed=1), config, RankLayout(0, 1, 2), map_fn=None,
                      image_token_id=IMAGE_TOKEN_ID, pad_values={"input_ids": 0, "labels": -100})
    loader.exchange_node().collect_metrics = collect
    return loader


def test_dp1_metrics_without_any_collective(tmp_path):
    loader = dp1_loader(window=2)
    records = []
    loader.exchange_node().add_observer(records.append)
    sink = TensorBoardSink(str(tmp_path))
    loader.exchange_node().add_observer(sink)
    assert loader.exchange_metrics() is None
    batches = [batch for _, batch in zip(range(6), loader)]
    sink.close()
    loader.close()
    assert [r.sequence for r in records] == [0, 1, 2] and [r.first_step for r in records] == [0, 2, 4]
    metrics = loader.exchange_metrics()
    assert metrics is records[-1].metrics and metrics["cumulative/windows"] == 3
    tokens = [sum(batch["image_tokens"]) for batch in batches]
    assert metrics["cumulative/image_tokens/after/critical_path"] == sum(tokens)
    assert metrics["cumulative/image_tokens/before/per_rank"] == [sum(tokens)]
    assert metrics["image_tokens/after/spread"] == 0 and metrics["moved/samples"] == 0 and metrics["rank/bytes_sent"] == 0
    assert all(r.on_training_thread and r.wait_seconds == r.exchange_seconds for r in records)
    assert set(records[0].seconds) <= set(PHASES) and "collate" in records[0].seconds
    logged = read_scalars(tmp_path)
    assert logged["image_tokens/after/critical_path"] == {0: sum(tokens[:2]), 2: sum(tokens[2:4]), 4: sum(tokens[4:])}
    assert logged["cumulative/image_tokens/after/critical_path"][4] == sum(tokens)
    assert set(logged["time/wait_s"]) == {0, 2, 4}


def test_metrics_can_be_switched_off():
    loader = dp1_loader(window=1, collect=False)
    records = []
    loader.exchange_node().add_observer(records.append)
    [batch for _, batch in zip(range(2), loader)]
    loader.close()
    assert loader.exchange_metrics() is None
    assert len(records) == 2 and all(r.metrics is None for r in records)


MODULE_WIDE = ("image_tokens/", "cost/", "moved/", "cumulative/image_tokens/", "cumulative/cost/", "cumulative/moved/")


@pytest.mark.parametrize("window,across,overlap", [(1, False, True), (3, True, True), (2, False, False)])
def test_observer_gets_one_record_per_window_and_bytes_balance(gloo_pool, window, across, overlap):
    components = ["language=dp=2", "images=dp=4,rank_offset=2"]
    steps = 6
    results = [r for r in gloo_pool.run(run_observed, components, steps=steps, micro_batch_size=8, window_size=window,
                                        across=across, overlap=overlap, seed=5) if r is not None]
    for module in ("language", "images"):
        ranks = [r for r in results if r["module"] == module]
        windows = steps // window
        for r in ranks:
            assert [rec["sequence"] for rec in r["records"]] == list(range(windows))
            assert [rec["first_step"] for rec in r["records"]] == list(range(0, steps, window))
            assert all(rec["on_training_thread"] is not overlap for rec in r["records"])
        for w in range(windows):
            records = [r["records"][w] for r in ranks]
            sent = sum(rec["bytes_sent"] for rec in records)
            assert sent == sum(rec["bytes_received"] for rec in records)
            assert sum(rec["samples_sent"] for rec in records) == sum(rec["samples_received"] for rec in records)
            for rec in records:
                assert rec["metrics"]["moved/bytes"] == sent
                assert rec["metrics"]["moved/samples"] == sum(x["samples_sent"] for x in records)
                assert rec["metrics"]["rank/bytes_sent"] == rec["bytes_sent"]
                if rec["metrics"]["moved/samples"]:
                    assert rec["seconds"]["all_to_all"] > 0 and rec["seconds"]["gather"] > 0
            # Every rank of the module computed the same module-wide figures from the one all-gather.
            shared = [{k: v for k, v in rec["metrics"].items() if k.startswith(MODULE_WIDE)} for rec in records]
            assert all(s == shared[0] for s in shared)
            # The "after" loads are what the ranks consumed.
            consumed = [sum(sum(b["image_tokens"]) for b in r["batches"][w * window : (w + 1) * window]) for r in ranks]
            by_rank = dict(zip((r["dp_rank"] for r in ranks), consumed))
            assert shared[0]["image_tokens/after/per_rank"] == [by_rank[k] for k in range(len(ranks))]


def without_times(metrics: dict) -> dict:
    """The cumulative figures a resumed run must reproduce exactly: all but the wall-clock times."""
    return {k: v for k, v in metrics.items() if k.startswith("cumulative/") and not k.startswith("cumulative/time/")}


@pytest.mark.parametrize("window,across,overlap", [(3, True, True), (2, False, False)])
def test_cumulative_figures_survive_a_resume(gloo_pool, window, across, overlap):
    """Stopped mid-window and at a window boundary, saved, restored in a new graph and run on: the same
    running totals as the uninterrupted run (times aside, which are the resumed run's own)."""
    components = ["language=dp=2", "images=dp=4,rank_offset=2"]
    steps, stop_at = 6, (1, window)
    results = [r for r in gloo_pool.run(cumulative_after_resume, components, steps=steps, stop_at=stop_at, micro_batch_size=8,
                                        window_size=window, across=across, overlap=overlap, seed=5) if r is not None]
    assert len(results) == 6
    for r in results:
        full = r["full"]
        assert full["cumulative/windows"] == steps // window and full["cumulative/microbatches"] == steps
        assert full["cumulative/image_tokens/before/critical_path"] > 0
        for stop in stop_at:
            resumed = r["resumed"][stop]
            assert without_times(resumed) == without_times(full), (r["module"], r["dp_rank"], stop)
            assert resumed["cumulative/time/exchange_s"] > 0
    assert any(r["full"]["cumulative/moved/samples"] for r in results)  # samples moved: the totals are not trivial
