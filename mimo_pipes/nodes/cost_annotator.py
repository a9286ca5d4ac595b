"""CostAnnotator: adds image-token, real-token and cost counts to each processed sample."""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode

from mimo_pipes.cost import image_token_count, real_token_count, sample_cost
from mimo_pipes.cost_model import TimeModel, placeholder_runs
from mimo_pipes.errors import SampleError
from mimo_pipes.sample import COST, ENCODER_COST, IMAGE_TOKENS, REAL_TOKENS, SAMPLE_ID, Sample


class CostAnnotator(BaseNode[Sample]):
    """Counts image placeholders in ``input_ids`` and real tokens in ``attention_mask``; cost = weighted sum.

    Weights are integers (``ReorderConfig.integer_cost_weights``), so every process gets the same cost.
    With a ``cost_model`` the encoder term is the modelled time of the sample's images (ns) instead of
    their token count.
    """

    SOURCE_KEY = "source"
    COST_MODEL_KEY = "cost_model"  # fingerprint of the time model (None: linear): costs made under another differ

    def __init__(self, source: BaseNode[Sample], *, image_token_id: int, encoder_weight: int, language_weight: int,
                 cost_model: TimeModel | None = None) -> None:
        super().__init__()
        if encoder_weight < 0 or language_weight < 0 or encoder_weight + language_weight == 0:
            raise ValueError(f"cost weights ({encoder_weight}, {language_weight}) must be >= 0 and not both 0")
        self.source = source
        self.image_token_id = image_token_id
        self.encoder_weight = encoder_weight
        self.language_weight = language_weight
        self.cost_model = cost_model

    def reset(self, initial_state: dict | None = None) -> None:
        super().reset(initial_state)
        if initial_state is not None and initial_state.get(self.COST_MODEL_KEY, self._fingerprint()) != self._fingerprint():
            raise ValueError(
                f"saved state was made with cost model {initial_state[self.COST_MODEL_KEY]}, this graph uses "
                f"{self._fingerprint()}: resume with the same --reorder-cost-model file"
            )
        self.source.reset(None if initial_state is None else initial_state[self.SOURCE_KEY])

    def next(self) -> Sample:
        sample = next(self.source)
        for field in ("input_ids", "attention_mask"):
            if field not in sample:
                raise SampleError(sample.get(SAMPLE_ID), "is needed to compute the sample's cost", field=field)
        image_tokens = image_token_count(sample["input_ids"], self.image_token_id)
        real_tokens = real_token_count(sample["attention_mask"])
        encoder_cost = image_tokens
        if self.cost_model is not None:
            encoder_cost = self.cost_model.encoder_time_ns(placeholder_runs(sample["input_ids"], self.image_token_id))
        sample[IMAGE_TOKENS] = image_tokens
        sample[REAL_TOKENS] = real_tokens
        sample[ENCODER_COST] = encoder_cost
        sample[COST] = sample_cost(encoder_cost, real_tokens, self.encoder_weight, self.language_weight)
        return sample

    def _fingerprint(self) -> str | None:
        return None if self.cost_model is None else self.cost_model.fingerprint()

    def get_state(self) -> dict[str, Any]:
        return {self.SOURCE_KEY: self.source.state_dict(), self.COST_MODEL_KEY: self._fingerprint()}
