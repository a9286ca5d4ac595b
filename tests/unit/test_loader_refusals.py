"""What a loader's ``load_state_dict`` is handed instead of a state is named for what it is: None (what
``load_pipeline_state`` gives where a checkpoint folder holds nothing to resume) or another kind of value."""

from __future__ import annotations

import pytest

from mimo_pipes.config import PipelineConfig
from mimo_pipes.exchange import RankLayout
from mimo_pipes.megatron.checkpoint import load_pipeline_state
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline


def loader():
    config = PipelineConfig(components=("language=dp=1",), micro_batch_size=2, embedded_samples=16, num_workers=1)
    return pipeline(SyntheticProcessedDataset(16), config, RankLayout(0, 1, 1), map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values={}), config


def test_none_from_a_folder_with_nothing_to_resume_is_named_as_such(tmp_path):
    graph, config = loader()
    try:
        state = load_pipeline_state(tmp_path, config=config)  # no tracker: nothing to resume
        assert state is None
        with pytest.raises(ValueError, match=r"^load_state_dict\(None\): no state to restore \(load_pipeline_state gives None") as raised:
            graph.load_state_dict(state)
        assert "saved before" not in str(raised.value) and "\n" not in str(raised.value)
        assert next(graph)["step"] == 0  # refused, nothing changed: the loader starts from the beginning
    finally:
        graph.close()


@pytest.mark.parametrize("value", [[1, 2], "state", 3], ids=repr)
def test_a_state_of_another_kind_is_named_by_its_kind(value):
    graph, _ = loader()
    try:
        with pytest.raises(ValueError, match=f"^load_state_dict: a state is the dict state_dict\\(\\) gave, got a {type(value).__name__}$"):
            graph.load_state_dict(value)
    finally:
        graph.close()
