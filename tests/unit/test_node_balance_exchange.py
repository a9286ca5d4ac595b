"""BalanceExchange at DP 1 (a local permutation, no group): the balanced order, restore at every position,
and what its state is valid for. Multi-rank exchanges are tested over Gloo in test_graph_dist.py."""

from __future__ import annotations

import pytest
from node_checks import assert_same, check_refused, check_save_load_everywhere, saved_after, take
from torchdata.nodes import BaseNode

from mimo_pipes.balance import balance_window
from mimo_pipes.errors import StateMismatchError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.nodes import BalanceExchange, CanonicalShardReader, CostAnnotator, Windower
from mimo_pipes.nodes.module_end import ModuleEnd
from mimo_pipes.samples.collate import Collator
from mimo_pipes.samples.sample import COST, SAMPLE_ID
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset, tail_settings

BATCH, GRID, WINDOW = 4, 2, 3
COLLATOR = Collator(1600)


def windows(window_size=WINDOW) -> BaseNode:
    """Costed windows of 7 micro-batches of 4 (DP 1 of a canonical grid of 2)."""
    dataset = SyntheticProcessedDataset(7 * BATCH, seed=11, text_tokens=2, patch_dim=1)
    reader = CanonicalShardReader(dataset, micro_batch_size=BATCH, dp_rank=0, dp_size=1, grid_size=GRID, dataloader_type="single")
    settings = tail_settings(samples_per_rank=BATCH, window_size=window_size, image_token_id=IMAGE_TOKEN_ID)
    return Windower(CostAnnotator(reader, settings=settings), settings=settings)


def exchange(collator=None, *, dp_rank=0, dp_size=1, grid_size=GRID, samples_per_rank=BATCH, window_size=WINDOW,
             across_microbatches=False) -> BalanceExchange:
    """The exchange of a rank at ``dp_rank`` of ``dp_size`` (no group: only DP 1 exchanges; the others are
    built to test what their states are valid for); with ``collator`` its samples are checked for that collation."""
    settings = tail_settings(samples_per_rank=samples_per_rank, dp_size=dp_size, window_size=window_size, reorder=True,
                             across_microbatches=across_microbatches, collator=collator or COLLATOR)
    layout = RankLayout(dp_rank, dp_size, grid_size)
    return BalanceExchange(windows(window_size), settings=settings, layout=layout, collatable=collator is not None)


@pytest.mark.parametrize("across", [False, True])
def test_dp1_puts_each_window_in_the_balanced_order(across):
    for before, after in zip(take(windows(), None), take(exchange(across_microbatches=across), None)):
        flat = [sample for microbatch in before.microbatches for sample in microbatch]
        plan = balance_window([[s[COST] for s in mb] for mb in before.microbatches], GRID, across_microbatches=across)
        expected = [[flat[i][SAMPLE_ID] for slot in slots for i in slot] for slots in plan]
        assert [[s[SAMPLE_ID] for s in mb] for mb in after.microbatches] == expected
        assert after.first_step == before.first_step
        assert sorted(s[SAMPLE_ID] for mb in after.microbatches for s in mb) == sorted(s[SAMPLE_ID] for s in flat)


@pytest.mark.parametrize("collator", [None, COLLATOR], ids=["samples", "collated"])
@pytest.mark.parametrize("across", [False, True])
def test_restores_at_every_position(collator, across):
    out = check_save_load_everywhere(lambda: exchange(collator, across_microbatches=across))
    assert [len(w.microbatches) for w in out] == [3, 3, 1] and not any(w.collated for w in out)


def test_it_only_exchanges_what_it_checks_for_collation():
    # Checked for a collation or not, the exchange hands on the same samples, uncollated: collation is after it.
    for plain, checked in zip(take(exchange(), None), take(exchange(COLLATOR), None), strict=True):
        assert not checked.collated and checked.first_step == plain.first_step
        assert_same(checked.microbatches, plain.microbatches)


MISMATCHES = [
    ("dp rank", dict(dp_rank=1, dp_size=2), 0, 1),
    ("dp size", dict(dp_size=2, samples_per_rank=2), 1, 2),
    ("canonical grid size", dict(grid_size=4), 2, 4),
    ("micro-batch size per rank", dict(samples_per_rank=2), 4, 2),
    ("window size", dict(window_size=2), 3, 2),
    ("reorder across micro-batches", dict(across_microbatches=True), False, True),
    ("collation pad length", dict(collator=Collator(None)), 1600, None),
]


@pytest.mark.parametrize("setting, overrides, saved, now", MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_refuses_a_state_made_for_other_settings(setting, overrides, saved, now):
    # refused in reset, before any collective: a DP 2 context without a group never gets to talk
    state = saved_after(exchange(COLLATOR), 1)
    check_refused(exchange(**{"collator": COLLATOR, **overrides}).reset, state, "BalanceExchange", setting, saved, now)


def test_a_state_saved_without_collation_is_refused_with_it():
    with pytest.raises(StateMismatchError, match=r"made with collation pad length \(not recorded\), this graph has 1600"):
        exchange(COLLATOR).reset(saved_after(exchange(), 1))


def cumulative(node: BalanceExchange) -> dict:
    """The node's running totals as its metrics show them, wall-clock times aside."""
    return {k: v for k, v in node.metrics().items() if k.startswith("cumulative/") and not k.startswith("cumulative/time/")}


@pytest.mark.parametrize("across", [False, True])
def test_state_carries_the_metrics_totals_across_a_restore(across):
    reference = exchange(COLLATOR, across_microbatches=across)
    take(reference, None)
    assert reference.metrics()["cumulative/windows"] == 3 and reference.metrics()["cumulative/microbatches"] == 7
    for position in range(4):
        node = exchange(COLLATOR, across_microbatches=across)
        state = saved_after(node, position)
        totals = state[BalanceExchange.METRICS_KEY]
        assert totals["windows"] == position and totals["microbatches"] == [0, 3, 6, 7][position]
        if position:
            assert node.metrics()["cumulative/image_tokens/after/critical_path"] == totals["sums"]["image_tokens/after/critical_path"]
        restored = exchange(COLLATOR, across_microbatches=across)
        restored.reset(state)
        assert restored.metrics() is None  # nothing delivered since the restore
        if take(restored, None):
            assert cumulative(restored) == cumulative(reference), position
            assert restored.metrics()["cumulative/time/exchange_s"] >= totals["sums"].get("time/exchange_s", 0)
    restarted = exchange(COLLATOR, across_microbatches=across)
    take(restarted, 2)
    restarted.reset(None)  # a fresh start, not a restore: the totals start again
    take(restarted, 1)
    assert restarted.metrics()["cumulative/windows"] == 1


def test_totals_start_again_on_another_layout():
    # a state of another layout (start_at): its totals are not mixed into this layout's
    from mimo_pipes.checkpoint.resume import ResumePoint

    state = saved_after(exchange(COLLATOR), 2)
    assert state[BalanceExchange.METRICS_KEY]["windows"] == 2
    node = exchange(COLLATOR)
    node.start_at(ResumePoint(6, 6, 0), state)
    node.reset(None)
    take(node, 1)
    assert node.metrics()["cumulative/windows"] == 1 and node.metrics()["cumulative/microbatches"] == node.metrics()["microbatches"]


@pytest.mark.parametrize("agree_after_end", [False, True])
def test_its_end_owes_the_agreement_after_it_only_where_rows_are_processed_after_it(agree_after_end):
    settings = tail_settings(samples_per_rank=BATCH, window_size=WINDOW, reorder=True, collator=COLLATOR)
    node = BalanceExchange(windows(), settings=settings, layout=RankLayout(0, 1, GRID), collatable=False, agree_after_end=agree_after_end)
    for failure in (None, ValueError("bad row")):
        node.reset(None)
        assert len(take(node, 3)) == 3  # 7 micro-batches in windows of 3
        with pytest.raises(StopIteration) as ended:
            next(node)
        assert isinstance(ended.value, ModuleEnd) == agree_after_end
        if agree_after_end and failure is None:
            ended.value.agree(None)  # DP 1: no peer to tell, nothing raised
        elif agree_after_end:
            with pytest.raises(ValueError, match="bad row"):  # a failure after the end is raised on the rank that had it
                ended.value.agree(failure)
