"""A recipe whose processing fails on one sample (sample id 5), for tests of how the failure is reported."""

from __future__ import annotations

from mimo_pipes.config import PipelineConfig
from mimo_pipes.errors import SampleError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.samples.sample import SAMPLE_ID
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline

BAD_SAMPLE = 5


def fail_on_bad_sample(sample: dict) -> dict:
    if sample[SAMPLE_ID] == BAD_SAMPLE:
        raise SampleError(BAD_SAMPLE, "cannot be tokenized", field="input_ids")
    return sample


def build(config: PipelineConfig, layout: RankLayout, *, consumed_microbatches: int = 0) -> GraphLoader:
    return pipeline(SyntheticProcessedDataset(64), config, layout, map_fn=fail_on_bad_sample,
                    image_token_id=IMAGE_TOKEN_ID, pad_values={}, consumed_microbatches=consumed_microbatches)
