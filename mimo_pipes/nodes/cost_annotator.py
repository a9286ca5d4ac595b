"""CostAnnotator: adds image-token, real-token and cost counts to each processed sample."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from torchdata.nodes import BaseNode

from mimo_pipes.cost import image_token_count, real_token_count, sample_cost
from mimo_pipes.cost_model import TimeModel, placeholder_runs
from mimo_pipes.errors import SampleError
from mimo_pipes.sample import COST, ENCODER_COST, IMAGE_TOKENS, REAL_TOKENS, SAMPLE_ID, Sample
from mimo_pipes.validity import VALID_FOR_KEY, check_valid_for, valid_for


class CostAnnotator(BaseNode[Sample]):
    """Counts vision placeholders in ``input_ids`` and real tokens in ``attention_mask``; cost = weighted sum.

    ``image_token_id`` is one placeholder id, or several (a family's image and video placeholders).

    Weights are integers (``ReorderConfig.integer_cost_weights``), so every process gets the same cost;
    ``language_square_weight`` (``ReorderConfig.integer_language_square_weight``) adds the attention term of
    a packed micro-batch, ``real_tokens**2``. With a ``cost_model`` the encoder term is the modelled time
    of the sample's images (ns) instead of their token count.
    The state is valid for one cost function (:meth:`cost_function`).
    """

    SOURCE_KEY = "source"
    VALID_FOR_KEY = VALID_FOR_KEY

    def __init__(
        self,
        source: BaseNode[Sample],
        *,
        image_token_id: int | Iterable[int],
        encoder_weight: int,
        language_weight: int,
        language_square_weight: int = 0,
        cost_model: TimeModel | None = None,
    ) -> None:
        super().__init__()
        if encoder_weight < 0 or language_weight < 0 or encoder_weight + language_weight == 0:
            raise ValueError(f"cost weights ({encoder_weight}, {language_weight}) must be >= 0 and not both 0")
        if language_square_weight < 0:
            raise ValueError(f"language_square_weight must be >= 0, got {language_square_weight}")
        self.source = source
        self.image_token_id = image_token_id if isinstance(image_token_id, int) else tuple(image_token_id)
        self.encoder_weight = encoder_weight
        self.language_weight = language_weight
        self.language_square_weight = language_square_weight
        self.cost_model = cost_model
        self.valid_for = valid_for(type(self).__name__, self.cost_function())

    def cost_function(self) -> dict[str, Any]:
        """Everything that decides a sample's cost, as plain values; a state is valid only for the same."""
        return {
            "image token id": self.image_token_id if isinstance(self.image_token_id, int) else list(self.image_token_id),
            "encoder cost weight": self.encoder_weight,
            "language cost weight": self.language_weight,
            "language square weight": self.language_square_weight,
            "cost model": None if self.cost_model is None else self.cost_model.fingerprint(),
        }

    def reset(self, initial_state: dict | None = None) -> None:
        if initial_state is not None:
            check_valid_for(initial_state, self.valid_for)
        super().reset(initial_state)
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
        sample[COST] = sample_cost(encoder_cost, real_tokens, self.encoder_weight, self.language_weight, self.language_square_weight)
        return sample

    def get_state(self) -> dict[str, Any]:
        return {self.VALID_FOR_KEY: copy.deepcopy(self.valid_for), self.SOURCE_KEY: self.source.state_dict()}
