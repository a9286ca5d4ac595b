"""GraphLoader over a whole recipe graph: restore at every position, a graph started from a consumed count
mid-window, and load_state_dict refusing a state made for another graph before anything is read."""

from __future__ import annotations

import copy

import pytest
from node_checks import as_saved, assert_same, check_save_load_everywhere, load_into_loader, take

from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.errors import StateMismatchError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline

STEPS = 9


def tag(sample: dict) -> dict:
    sample["tagged"] = sample["sample_id"] * 2
    return sample


def graph(consumed: int = 0, *, map_fn=None, window_size: int = 3, reorder: bool = True, seed: int = 3) -> GraphLoader:
    config = PipelineConfig(
        components=("language=dp=1",), micro_batch_size=4, seq_length=1600, seed=seed, num_workers=2,
        processing="thread",  # the loader's state logic; worker processes: tests/distributed/test_payload_dist.py
        reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=reorder, reorder_window_size=window_size),
    )
    dataset = SyntheticProcessedDataset(40, seed=seed, text_tokens=4, patch_dim=2)
    return pipeline(dataset, config, RankLayout(0, 1, 1), map_fn=map_fn, image_token_id=IMAGE_TOKEN_ID,
                    pad_values={"labels": -100}, consumed_microbatches=consumed)


@pytest.mark.parametrize("reorder", [True, False])
def test_restores_at_every_position(reorder):
    batches = check_save_load_everywhere(lambda: graph(reorder=reorder), STEPS, restore=load_into_loader)
    assert [batch["step"] for batch in batches] == list(range(STEPS))


@pytest.mark.parametrize("consumed", [4, 5])  # one and two into the second window of W=3
def test_state_of_a_count_start_before_and_right_after_its_first_item(consumed):
    reference_loader = graph(map_fn=tag)
    reference = take(reference_loader, STEPS)
    reference_loader.close()
    started = graph(consumed, map_fn=tag)
    saved = {consumed: as_saved(started.state_dict())}  # before the first item
    assert_same(take(started, 1), reference[consumed : consumed + 1])
    saved[consumed + 1] = as_saved(started.state_dict())  # right after it
    started.close()
    for position, state in saved.items():
        for built_from in (0, consumed):  # the state decides, not the count the new graph was built with
            restored = graph(built_from, map_fn=tag)
            restored.load_state_dict(copy.deepcopy(state))
            assert restored.consumed_microbatches == position
            assert_same(take(restored, STEPS - position), reference[position:], f"state at {position}, graph built from {built_from}")
            assert restored.consumed_microbatches == STEPS
            restored.close()


def test_load_state_dict_refuses_at_once_naming_the_setting():
    state = as_saved(graph().state_dict())
    loader = graph(window_size=2)
    with pytest.raises(StateMismatchError, match="^BalanceExchange: saved state was made with window size 3, this graph has 2$"):
        loader.load_state_dict(state)
    assert not loader._started, "a refused state must leave the loader untouched"
    with pytest.raises(StateMismatchError, match="^CanonicalShardReader: saved state was made with seed 3, this graph has 4$"):
        graph(seed=4).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="Windower: the saved state is a BalanceExchange's state, not a Windower's"):
        graph(reorder=False).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="BalanceExchange: the saved state is a Windower's state"):
        graph().load_state_dict(as_saved(graph(reorder=False).state_dict()))


def strip_descriptions(state):
    if isinstance(state, dict):
        return {key: strip_descriptions(value) for key, value in state.items() if key != "valid_for"}
    return state


def test_a_state_saved_before_states_were_checked_is_refused():
    legacy = strip_descriptions(as_saved(graph().state_dict()))
    with pytest.raises(StateMismatchError, match="MicroBatchAssembler: the saved state does not say what it is valid for"):
        graph().load_state_dict(legacy)
    node = graph().root  # a node restored directly refuses it too
    with pytest.raises(StateMismatchError, match="does not say what it is valid for"):
        node.reset(legacy["root"])
