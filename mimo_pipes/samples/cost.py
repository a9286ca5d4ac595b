"""Per-sample cost: exact integers from fields that are identical on every module."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mimo_pipes.samples.cost_range import check_sample_cost
from mimo_pipes.time_model.model import TimeModel

INT64_MAX = 2**63 - 1
SMALL_ID_SET = 8  # placeholder ids compared one by one up to this many (np.isin beyond)


def placeholder_mask(ids: np.ndarray, placeholder_ids: int | Iterable[int]) -> np.ndarray:
    """Where ``ids`` holds one of ``placeholder_ids`` (one id, or several). A model has one to a few placeholder
    ids: compared one by one, which is several times faster than ``np.isin`` on a row's ids (rows are counted
    on the rank's process, beside its training thread)."""
    wanted = [placeholder_ids] if isinstance(placeholder_ids, (int, np.integer)) else list(placeholder_ids)
    if len(wanted) > SMALL_ID_SET:
        return np.isin(ids, wanted)
    inside = np.zeros(ids.shape, dtype=np.bool_)
    for wanted_id in wanted:
        inside |= ids == wanted_id
    return inside


def image_token_count(input_ids: Any, image_token_id: int | Iterable[int]) -> int:
    """Vision placeholder tokens (tensor, array or list; any shape): one per merged vision patch, so
    proportional to encoder work. ``image_token_id``: one id, or several (image and video placeholders)."""
    ids = [image_token_id] if isinstance(image_token_id, (int, np.integer)) else list(image_token_id)
    if isinstance(input_ids, torch.Tensor):
        return int(torch.isin(input_ids, torch.tensor(ids, dtype=input_ids.dtype)).sum())
    return int(np.count_nonzero(placeholder_mask(np.asarray(input_ids), ids)))


def real_token_count(attention_mask: torch.Tensor) -> int:
    """Real (unpadded) tokens; never the padded length, which differs with --seq-length."""
    return int(attention_mask.sum())


def sample_cost(
    image_tokens: int, real_tokens: int, encoder_weight: int, language_weight: int, language_square_weight: int = 0
) -> int:
    """``w_enc * image_tokens + w_lang * real_tokens + w_sq * real_tokens**2`` with integer weights (see
    ReorderConfig). The square term is attention under sequence packing: a packed rank's language time
    grows with the sum of its sequences' squared lengths, and that sum adds up sample by sample."""
    return encoder_weight * image_tokens + language_weight * real_tokens + language_square_weight * real_tokens**2


def placeholder_runs(input_ids: Any, placeholder_ids: int | Sequence[int], inside: np.ndarray | None = None) -> list[int]:
    """Lengths of the maximal runs of one placeholder id in ``input_ids`` (tensor, array or list), in order.

    Each run is one image or video. Runs of different placeholder ids that touch are separate; a run cut
    off at the end of the sequence (truncated text) counts with the tokens that are there. ``inside``: the
    ids' :func:`placeholder_mask`, when the caller has it already."""
    if hasattr(input_ids, "detach"):
        input_ids = input_ids.detach().cpu().numpy()
    ids = np.asarray(input_ids).reshape(-1)
    if inside is None:
        inside = placeholder_mask(ids, placeholder_ids)
    if not inside.any():
        return []
    # A run starts where a placeholder follows a non-placeholder or a different placeholder.
    starts = inside & np.concatenate(([True], (ids[1:] != ids[:-1]) | ~inside[:-1]))
    begin = np.flatnonzero(starts)
    marks = np.cumsum(starts)[inside]  # run number of every placeholder token
    return np.bincount(marks - 1, minlength=begin.shape[0]).tolist()


@dataclass(frozen=True)
class CostFunction:
    """How every module prices a sample: integer weights (``ReorderConfig.integer_cost_weights``) and, with a
    time model, the modelled time of the sample's images (ns) as its encoder term instead of their tokens."""

    encoder_weight: int
    language_weight: int
    language_square_weight: int = 0
    time_model: TimeModel | None = None

    def __post_init__(self) -> None:
        if self.encoder_weight < 0 or self.language_weight < 0 or self.encoder_weight + self.language_weight == 0:
            raise ValueError(f"cost weights ({self.encoder_weight}, {self.language_weight}) must be >= 0 and not both 0")
        if self.language_square_weight < 0:
            raise ValueError(f"language_square_weight must be >= 0, got {self.language_square_weight}")

    def encoder_cost(self, input_ids: Any, image_token_ids: int | Sequence[int], image_tokens: int) -> int:
        """The encoder term of a sample: its ``image_tokens``, or with a time model its images' modelled ns
        (from the placeholder runs of ``image_token_ids`` in ``input_ids``)."""
        if self.time_model is None:
            return image_tokens
        return self.encoder_cost_of_runs(placeholder_runs(input_ids, image_token_ids), image_tokens)

    def encoder_cost_of_runs(self, runs: Sequence[int], image_tokens: int) -> int:
        """The encoder term of a sample whose placeholder runs (one per image or video) are ``runs``."""
        if self.time_model is None:
            return image_tokens
        return self.time_model.encoder_time_ns(list(runs))

    @property
    def weights(self) -> tuple[int, int, int]:
        return self.encoder_weight, self.language_weight, self.language_square_weight

    def cost(self, encoder_cost: Any, real_tokens: Any) -> Any:
        """The sample's cost (ints), or of many samples (int64 arrays): exact, or ConfigError naming the
        flag when one would leave int64 (an array is never left to wrap around)."""
        if not isinstance(encoder_cost, np.ndarray) and not isinstance(real_tokens, np.ndarray):
            return sample_cost(encoder_cost, real_tokens, *self.weights)
        encoder, real = np.asarray(encoder_cost), np.asarray(real_tokens)  # int64, or Python ints (object)
        if encoder.size == 0:
            return sample_cost(encoder.astype(np.int64), real.astype(np.int64), *self.weights)
        top_encoder, top_real = int(np.abs(encoder).max()), int(np.abs(real).max())
        if max(self.weights) <= INT64_MAX and sample_cost(top_encoder, top_real, *self.weights) <= INT64_MAX:
            # every term and partial sum fits: exact in int64
            return sample_cost(encoder.astype(np.int64), real.astype(np.int64), *self.weights)
        exact = sample_cost(encoder.astype(object), real.astype(object), *self.weights)
        for row in np.flatnonzero(np.abs(exact) > INT64_MAX).tolist()[:1]:
            one_encoder, one_real = int(encoder[row]), int(real[row])
            check_sample_cost(self.time_model, row, one_encoder, *self.terms(one_encoder, one_real), budget=INT64_MAX, samples=1)
        return exact.astype(np.int64)

    def terms(self, encoder_cost: int, real_tokens: int) -> tuple[int, int]:
        """(weighted encoder term, weighted language term) of one sample: its cost is their sum."""
        return self.encoder_weight * encoder_cost, self.language_weight * real_tokens + self.language_square_weight * real_tokens**2

    def check_range(self, sample_id: object, encoder_cost: int, real_tokens: int, budget: int, samples: int) -> None:
        """ConfigError naming the flag when the sample's cost or encoder cost is beyond ``budget``
        (:func:`~mimo_pipes.samples.cost_range.window_budget` of a window of ``samples`` samples)."""
        check_sample_cost(self.time_model, sample_id, encoder_cost, *self.terms(encoder_cost, real_tokens), budget=budget, samples=samples)

    def describe(self) -> dict[str, Any]:
        """Everything in the weights and model that decides a cost, as plain values (a saved state is valid
        only for the same)."""
        return {
            "encoder cost weight": self.encoder_weight,
            "language cost weight": self.language_weight,
            "language square weight": self.language_square_weight,
            "time model": None if self.time_model is None else self.time_model.fingerprint(),
        }
