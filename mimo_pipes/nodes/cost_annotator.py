"""CostAnnotator: adds image-token, real-token and cost counts to each processed sample."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torchdata.nodes import BaseNode

from mimo_pipes.cost import image_token_count, real_token_count, sample_cost
from mimo_pipes.errors import SampleError
from mimo_pipes.sample import COST, IMAGE_TOKENS, REAL_TOKENS, SAMPLE_ID, Sample


class CostAnnotator(BaseNode[Sample]):
    """Counts vision placeholders in ``input_ids`` and real tokens in ``attention_mask``; cost = weighted sum.

    ``image_token_id`` is one placeholder id, or several (a family's image and video placeholders).

    Weights are integers (``ReorderConfig.integer_cost_weights``), so every process gets the same cost.
    """

    SOURCE_KEY = "source"

    def __init__(self, source: BaseNode[Sample], *, image_token_id: int | Iterable[int], encoder_weight: int, language_weight: int) -> None:
        super().__init__()
        if encoder_weight < 0 or language_weight < 0 or encoder_weight + language_weight == 0:
            raise ValueError(f"cost weights ({encoder_weight}, {language_weight}) must be >= 0 and not both 0")
        self.source = source
        self.image_token_id = image_token_id if isinstance(image_token_id, int) else tuple(image_token_id)
        self.encoder_weight = encoder_weight
        self.language_weight = language_weight

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        self.source.reset(None if initial_state is None else initial_state[self.SOURCE_KEY])

    def next(self) -> Sample:
        sample = next(self.source)
        for field in ("input_ids", "attention_mask"):
            if field not in sample:
                raise SampleError(sample.get(SAMPLE_ID), "is needed to compute the sample's cost", field=field)
        image_tokens = image_token_count(sample["input_ids"], self.image_token_id)
        real_tokens = real_token_count(sample["attention_mask"])
        sample[IMAGE_TOKENS] = image_tokens
        sample[REAL_TOKENS] = real_tokens
        sample[COST] = sample_cost(image_tokens, real_tokens, self.encoder_weight, self.language_weight)
        return sample

    def get_state(self) -> dict[str, Any]:
        return {self.SOURCE_KEY: self.source.state_dict()}
