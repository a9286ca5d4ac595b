"""The language cost under sequence packing: L + L^2 / crossover per sample, exact integer weights."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchdata.nodes import IterableWrapper

from mimo_pipes.config import ReorderConfig
from mimo_pipes.errors import ConfigError
from mimo_pipes.nodes import CostAnnotator
from mimo_pipes.samples.cost import sample_cost
from mimo_pipes.samples.sample import COST
from mimo_pipes.testing import tail_settings

weights = st.fractions(min_value=0, max_value=20, max_denominator=50)


@settings(max_examples=100, deadline=None)
@given(encoder=weights, language=weights.filter(lambda w: w > 0), crossover=st.integers(1, 10**6),
       lengths=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 8192)), min_size=1, max_size=20))
def test_packed_cost_is_exact_and_adds_up_sample_by_sample(encoder, language, crossover, lengths):
    config = ReorderConfig(reorder_encoder_cost_weight=str(encoder), reorder_language_cost_weight=str(language),
                           reorder_language_cost="packed", reorder_attention_crossover=crossover)
    config.validate()
    w_enc, w_lang = config.integer_cost_weights()
    w_sq = config.integer_language_square_weight()
    assert all(isinstance(w, int) and w >= 0 for w in (w_enc, w_lang, w_sq))
    # The same ratios as the fractions the user gave: w_enc : w_lang : w_sq = encoder : language : language / crossover.
    scale = Fraction(w_lang) / language
    assert Fraction(w_enc) == encoder * scale and Fraction(w_sq) == language / crossover * scale
    assert Fraction(w_sq) * crossover == w_lang
    # A rank's packed cost (sum over its samples) is exactly scale * sum(w_e I + w_l (L + L^2 / crossover)).
    total = sum(sample_cost(image, real, w_enc, w_lang, w_sq) for image, real in lengths)
    exact = sum(encoder * image + language * (real + Fraction(real * real, crossover)) for image, real in lengths)
    assert Fraction(total) == exact * scale


def test_tokens_cost_is_unchanged_by_default():
    config = ReorderConfig(reorder_encoder_cost_weight="2", reorder_language_cost_weight="0.5")
    assert config.integer_cost_weights() == (4, 1)
    assert config.integer_language_square_weight() == 0
    assert sample_cost(10, 300, 4, 1) == 340


def test_cost_annotator_adds_the_attention_term():
    samples = [{"sample_id": 0, "step": 0, "input_ids": torch.tensor([5, 9, 9, 1]), "attention_mask": torch.ones(4, dtype=torch.int64)}]
    config = ReorderConfig(reorder_language_cost_weight="1", reorder_language_cost="packed", reorder_attention_crossover=8)
    w_enc, w_lang = config.integer_cost_weights()
    settings = tail_settings(samples_per_rank=1, image_token_id=9, encoder_weight=w_enc, language_weight=w_lang,
                             language_square_weight=config.integer_language_square_weight())
    node = CostAnnotator(IterableWrapper(samples), settings=settings)
    node.reset()
    # 1 * 2 image tokens + 1 * (4 + 16 / 8) = 8, on the integer scale 8: 16 + 32 + 16
    assert (w_enc, w_lang, config.integer_language_square_weight()) == (8, 8, 1)
    assert next(node)[COST] == 8 * 2 + 8 * 4 + 16


@pytest.mark.parametrize(
    "fields, flag",
    [
        ({"reorder_language_cost": "quadratic"}, "reorder_language_cost"),
        ({"reorder_language_cost": "packed"}, "reorder_language_cost"),  # language weight 0: no effect
        ({"reorder_language_cost": "packed", "reorder_language_cost_weight": 1, "reorder_attention_crossover": 0},
         "reorder_attention_crossover"),
    ],
)
def test_bad_language_cost_settings_name_the_field(fields, flag):
    with pytest.raises(ConfigError, match=f"^{flag}"):
        ReorderConfig(**fields).validate()


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--pack-sequences-in-batch", "--pack-pad-multiple", "0"], "--pack-pad-multiple"),
        (["--reorder-language-cost", "packed"], "--reorder-language-cost"),
    ],
)
def test_run_refuses_bad_packing_flags_with_exit_2(args, flag, capsys):
    # In-process: the command's own refusal before any rank starts (test_cli_validation.py runs the console script).
    from mimo_pipes.cli.main import main

    assert main(["run", *args]) == 2
    stderr = capsys.readouterr().err
    assert flag in stderr and "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
