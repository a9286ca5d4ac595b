"""CostAnnotator: per-sample counts and cost, restore at every position, and what its state is valid for."""

from __future__ import annotations

import pytest
import torch
from node_checks import check_refused, check_save_load_everywhere, saved_after, take
from torchdata.nodes import IterableWrapper

from mimo_pipes.errors import SampleError, StateMismatchError
from mimo_pipes.nodes import CanonicalShardReader, CostAnnotator
from mimo_pipes.samples.sample import COST, IMAGE_TOKENS, REAL_TOKENS, SAMPLE_ID, STEP
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset, image_tokens_for, tail_settings

DATASET = SyntheticProcessedDataset(24, seed=7, text_tokens=4, patch_dim=2)


def annotator(encoder_weight=3, language_weight=2, image_token_id=IMAGE_TOKEN_ID, node=CostAnnotator) -> CostAnnotator:
    source = CanonicalShardReader(DATASET, micro_batch_size=4, dp_rank=0, dp_size=1, grid_size=2, dataloader_type="single")
    settings = tail_settings(samples_per_rank=4, image_token_id=image_token_id, encoder_weight=encoder_weight, language_weight=language_weight)
    return node(source, settings=settings)


def test_restores_at_every_position():
    assert len(check_save_load_everywhere(annotator)) == 24


def test_counts_and_cost_of_each_sample():
    for sample in take(annotator(), None):
        image_tokens = image_tokens_for(sample[SAMPLE_ID], 7)
        real_tokens = image_tokens + 4 + sample[SAMPLE_ID] % 7
        assert (sample[IMAGE_TOKENS], sample[REAL_TOKENS]) == (image_tokens, real_tokens)
        assert sample[COST] == 3 * image_tokens + 2 * real_tokens


def test_bad_weights_and_samples():
    with pytest.raises(ValueError, match="must be >= 0 and not both 0"):
        annotator(encoder_weight=0, language_weight=0)
    with pytest.raises(ValueError, match="must be >= 0"):
        annotator(encoder_weight=-1)
    node = CostAnnotator(IterableWrapper([{SAMPLE_ID: 9, STEP: 0, "input_ids": torch.ones(3, dtype=torch.int64)}]), settings=tail_settings(samples_per_rank=1))
    with pytest.raises(SampleError, match="sample 9, field 'attention_mask'"):
        next(node)


MISMATCHES = [
    ("encoder cost weight", dict(encoder_weight=1), 3, 1),
    ("language cost weight", dict(language_weight=0), 2, 0),
    ("image token id", dict(image_token_id=5), IMAGE_TOKEN_ID, 5),
]


@pytest.mark.parametrize("setting, overrides, saved, now", MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_refuses_a_state_made_for_another_cost_function(setting, overrides, saved, now):
    check_refused(annotator(**overrides).reset, saved_after(annotator(), 3), "CostAnnotator", setting, saved, now)


class ModelledCost(CostAnnotator):
    """Stands for an annotator whose cost function has another ingredient: it describes it too."""

    def cost_function(self):
        return {**super().cost_function(), "time model": "model-fingerprint-1"}


def test_the_cost_function_description_decides_validity():
    state = saved_after(annotator(), 3)
    state["valid_for"]["node"] = "ModelledCost"
    with pytest.raises(StateMismatchError, match=r"ModelledCost: saved state was made with time model none, this graph has model-fingerprint-1"):
        annotator(node=ModelledCost).reset(state)
    modelled = saved_after(annotator(node=ModelledCost), 3)
    restored = annotator(node=ModelledCost)
    restored.reset(modelled)
    assert [s[SAMPLE_ID] for s in take(restored, None)] == [s[SAMPLE_ID] for s in take(annotator(), None)[3:]]
