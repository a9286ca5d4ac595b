"""Costs inside the integer range the planners use, checked before anything is balanced.

Costs are exact integers, but the exchange packs every sample's cost (and encoder cost) as int64 and the
planners sum a window's costs in int64 (``balance.validate.MAX_TOTAL_COST``, 2**62 - 1, so that any sum
or difference they form later stays exact). A window of ``n`` samples over ``W`` micro-batches with a
per-forward floor ``f`` is safe when ``W * f + n * c <= MAX_TOTAL_COST`` for its costliest sample ``c``.
:func:`check_cost_range` proves that from the settings (the largest cost a sample of ``--seq-length``
tokens can have); :func:`check_sample_cost` checks a sample where no length bounds it. Both name the flag
at fault (ConfigError). Pure integer arithmetic, torch-free.
"""

from __future__ import annotations

from mimo_pipes.balance.validate import MAX_TOTAL_COST
from mimo_pipes.errors import ConfigError, setting_name
from mimo_pipes.time_model.model import TimeModel

FLAGS = {"reorder_encoder_cost_weight": "--reorder-encoder-cost-weight", "reorder_language_cost_weight": "--reorder-language-cost-weight",
         "reorder_cost_model": "--reorder-cost-model", "seq_length": "--seq-length"}


def _name(field: str) -> str:
    """The setting as errors name it: the field in Python, the flag inside a command."""
    return setting_name(field, FLAGS[field])


def window_budget(window_samples: int, window_microbatches: int, floor: int) -> int:
    """The largest sample cost a window of ``window_samples`` samples (``window_microbatches`` forwards of
    at least ``floor``) can hold with every planner sum exact; negative when the floors alone overflow."""
    return (MAX_TOTAL_COST - window_microbatches * floor) // max(window_samples, 1)


def largest_terms(weights: tuple[int, int, int], model: TimeModel | None, tokens: int) -> tuple[int, int, int]:
    """(encoder cost, weighted encoder term, weighted language term), each the largest a sample of at most
    ``tokens`` tokens can have: placeholders and real tokens are at most ``tokens`` each."""
    encoder_weight, language_weight, square_weight = weights
    encoder = tokens if model is None else model.max_encoder_time_ns(tokens)
    return encoder, encoder_weight * encoder, language_weight * tokens + square_weight * tokens * tokens


def _at_fault(encoder: int, encoder_term: int, language_term: int, budget: int, model: TimeModel | None) -> tuple[str, str]:
    """(flag, what to do) for a cost beyond ``budget``."""
    if model is not None and encoder > budget:
        return _name("reorder_cost_model"), "its terms are too large for such samples"
    if encoder > budget:
        return _name("seq_length"), f"use a shorter {_name('seq_length')}"
    if encoder_term >= language_term:
        return _name("reorder_encoder_cost_weight"), "use smaller weights (only their ratio matters)"
    return _name("reorder_language_cost_weight"), "use smaller weights (only their ratio matters)"


def check_cost_range(
    weights: tuple[int, int, int],
    model: TimeModel | None,
    *,
    max_tokens: int,
    micro_batch_size: int,
    window_microbatches: int,
    floor: int,
) -> None:
    """Refuse settings under which a sample of ``max_tokens`` tokens could leave the planners' range in a
    window of ``window_microbatches`` micro-batches of ``micro_batch_size`` samples: ConfigError naming the
    flag (a weight, the time model, ``--seq-length``)."""
    samples = micro_batch_size * window_microbatches
    budget = window_budget(samples, window_microbatches, floor)
    if budget < 0:
        raise ConfigError(_name("reorder_cost_model"), f"its per-forward floor ({floor} in cost units) over a window of {window_microbatches} "
                                           "micro-batches is beyond the int64 range of the planners")
    encoder, encoder_term, language_term = largest_terms(weights, model, max_tokens)
    largest = encoder_term + language_term
    if max(largest, encoder) > budget:
        flag, advice = _at_fault(encoder, encoder_term, language_term, budget, model)
        raise ConfigError(flag, f"a sample of {_name('seq_length')} {max_tokens} tokens can cost up to {max(largest, encoder)}, more than "
                                f"{budget} (the int64 range of the planners over a window of {samples} samples); {advice}")


def check_sample_cost(
    model: TimeModel | None, sample_id: object, encoder: int, encoder_term: int, language_term: int, budget: int, samples: int
) -> None:
    """Refuse one sample whose cost (or encoder cost) is beyond ``budget`` (:func:`window_budget`)."""
    cost = encoder_term + language_term
    if max(cost, encoder) > budget:
        flag, advice = _at_fault(encoder, encoder_term, language_term, budget, model)
        raise ConfigError(flag, f"sample {sample_id} costs {max(cost, encoder)}, more than {budget} (the int64 range of the "
                                f"planners over a window of {samples} samples); {advice}")
