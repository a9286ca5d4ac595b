"""CostAnnotator: prices each sample (or counted row) and keeps only the fields its module carries."""

from __future__ import annotations

from typing import Any

from torchdata.nodes import BaseNode

from mimo_pipes.config.tail_settings import TailSettings
from mimo_pipes.errors import SampleError
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.samples.checks import check_sample
from mimo_pipes.samples.cost import image_token_count, real_token_count
from mimo_pipes.samples.cost_range import window_budget
from mimo_pipes.samples.sample import COST, ENCODER_COST, IMAGE_TOKENS, PLACEHOLDER_RUNS, REAL_TOKENS, SAMPLE_ID, Sample


class CostAnnotator(GraphNode[Sample]):
    """Counts vision placeholders in ``input_ids`` and real tokens in ``attention_mask``, and prices the
    sample with ``settings.plan.cost`` (:class:`~mimo_pipes.samples.cost.CostFunction`): integer weights, so every
    process gets the same cost; with a time model the encoder term is the modelled time of the sample's
    images (ns) instead of their token count. Then drops the fields its module does not carry
    (``settings.fields``), before they move.

    Under the ``rows`` payload its items are rows counted before the tail (image tokens, real tokens and
    placeholder runs as metadata, from their text and image headers:
    :meth:`~mimo_pipes.data.processing.row_counter.RowCounter.count`), priced alike. The state is valid for
    one cost function.
    """

    def __init__(self, source: BaseNode[Sample], *, settings: TailSettings) -> None:
        super().__init__(source)
        self.cost = settings.plan.cost
        self.image_token_ids = settings.image_token_ids
        self.rows = settings.processing.rows
        self.fields = settings.fields
        # Every cost must fit the planners' int64 sums over the window (the settings' --seq-length check
        # proves it where a length bounds the samples; a balance_iterator without one relies on this).
        window = settings.plan.window_size
        self.window_samples = settings.micro_batch_size * window
        self.budget = window_budget(self.window_samples, window, settings.plan.planner.floor)
        self.describe(self.cost_function())

    def cost_function(self) -> dict[str, Any]:
        """Everything that decides a sample's cost, as plain values; a state is valid only for the same."""
        ids = self.image_token_ids
        return {"image token id": ids[0] if len(ids) == 1 else list(ids), **self.cost.describe()}

    def next(self) -> Sample:
        sample = next(self.source)
        check_sample(sample)  # a plug-in's mistake named here, where the sample enters the tail
        if self.rows:
            image_tokens, real_tokens, encoder_cost = self._counted(sample)
        else:
            for field in ("input_ids", "attention_mask"):
                if field not in sample:
                    raise SampleError(sample.get(SAMPLE_ID), "is needed to compute the sample's cost", field=field)
            image_tokens = image_token_count(sample["input_ids"], self.image_token_ids)
            real_tokens = real_token_count(sample["attention_mask"])
            encoder_cost = self.cost.encoder_cost(sample["input_ids"], self.image_token_ids, image_tokens)
            sample = self.fields.select(sample)
        self.cost.check_range(sample.get(SAMPLE_ID), encoder_cost, real_tokens, self.budget, self.window_samples)
        sample[IMAGE_TOKENS] = image_tokens
        sample[REAL_TOKENS] = real_tokens
        sample[ENCODER_COST] = encoder_cost
        sample[COST] = self.cost.cost(encoder_cost, real_tokens)
        return sample

    def _counted(self, row: Sample) -> tuple[int, int, int]:
        """A counted row's image tokens, real tokens and encoder cost; its runs are dropped once priced."""
        missing = next((key for key in (IMAGE_TOKENS, REAL_TOKENS, PLACEHOLDER_RUNS) if key not in row), None)
        if missing is not None:
            raise SampleError(row.get(SAMPLE_ID), "is not counted: under --exchange-payload rows every row is counted "
                              "before the tail (RowCounter.count)", field=missing)
        image_tokens, real_tokens = int(row[IMAGE_TOKENS]), int(row[REAL_TOKENS])
        return image_tokens, real_tokens, self.cost.encoder_cost_of_runs(row.pop(PLACEHOLDER_RUNS), image_tokens)
