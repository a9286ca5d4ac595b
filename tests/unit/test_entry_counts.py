"""Counts are integers at every entry alike: build, the adapters' start positions and restores, Megatron's
conversions and the config's integer settings take numpy and torch integers as ints, and refuse bools, floats
(6.0 = 24 / 4 included) and strings at the call, in one line naming the argument."""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torchdata.nodes import IterableWrapper

from mimo_pipes.adapters.microbatch_iterator import balance_iterator
from mimo_pipes.adapters.torchdata_pipeline import balanced_loader, reader_first_step
from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.config.counts import as_count
from mimo_pipes.config.flags import cli_flag, flag_names
from mimo_pipes.config.job_options import JobOptions, TrainOptions
from mimo_pipes.errors import ConfigError, StateMismatchError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.megatron import global_microbatch_size, microbatches_from_samples, samples_from_microbatches
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes import tiny_mimo_train, vlm_sft

NOT_COUNTS = [24 / 4, 6.5, True, False, "6", None, np.float64(6.0), np.bool_(True), torch.tensor(6.0), torch.tensor([6]),
              torch.tensor(True)]
SAME_COUNTS = [6, np.int64(6), np.int32(6), np.uint8(6), torch.tensor(6), torch.tensor(6, dtype=torch.int32)]
LAYOUT = RankLayout(dp_rank=0, dp_size=1, grid_size=1)


def config() -> PipelineConfig:
    return PipelineConfig(components=("language=dp=1",), micro_batch_size=2, seq_length=2048, embedded_samples=16, num_workers=1)


def refused_at_the_call(call, name: str, value) -> None:
    with pytest.raises(ConfigError) as error:
        call(value)
    message = str(error.value)
    assert message.startswith(f"{name}: must be an integer") and "\n" not in message, message
    assert error.value.setting == name


@given(st.integers(-(2**62), 2**62))
def test_numpy_and_torch_integers_are_the_same_count(number):
    forms = [number, np.int64(number), torch.tensor(number)]
    if number >= 0:
        assert {as_count(form, "n") for form in forms} == {number}
        assert all(type(as_count(form, "n")) is int for form in forms)
    else:
        for form in forms:
            with pytest.raises(ConfigError, match=f"^n: must be an integer >= 0, got {number}$"):
                as_count(form, "n")


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_every_float_is_refused_even_a_whole_one(number):
    for form in (number, np.float64(number), torch.tensor(number, dtype=torch.float64)):
        with pytest.raises(ConfigError, match="^n: must be an integer >= 0, got .*float"):
            as_count(form, "n")


@pytest.mark.parametrize("value", NOT_COUNTS, ids=repr)
@pytest.mark.parametrize("build", [vlm_sft.build, tiny_mimo_train.build], ids=["vlm_sft", "tiny_mimo_train"])
def test_build_refuses_a_count_that_is_not_an_integer_at_the_call(build, value):
    refused_at_the_call(lambda v: build(config(), LAYOUT, consumed_microbatches=v), "consumed_microbatches", value)


def test_build_takes_numpy_and_torch_integers_as_ints():
    starts = []
    for value in (np.int64(3), torch.tensor(3), 3):
        loader = vlm_sft.build(config(), LAYOUT, consumed_microbatches=value)
        try:
            assert loader.consumed_microbatches == 3 and type(loader.consumed_microbatches) is int
            starts.append((next(loader)["step"], next(loader)["sample_ids"]))
        finally:
            loader.close()
    assert starts[0][0] == 3 and starts.count(starts[0]) == 3


@pytest.mark.parametrize("value", NOT_COUNTS, ids=repr)
def test_the_adapters_and_the_loader_refuse_it_alike(value):
    reorder = ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=2)
    refused_at_the_call(lambda v: reader_first_step(reorder, v), "consumed_microbatches", value)
    refused_at_the_call(lambda v: GraphLoader(IterableWrapper([]), consumed_microbatches=v), "consumed_microbatches", value)
    samples = IterableWrapper([])
    refused_at_the_call(lambda v: balanced_loader(samples, reorder=reorder, layout=LAYOUT, micro_batch_size=2, seq_length=64,
                                                  image_token_id=IMAGE_TOKEN_ID, pad_values={}, consumed_microbatches=v),
                        "consumed_microbatches", value)
    for source in ({"microbatches": iter([])}, {"source_factory": lambda first: iter([])}):
        refused_at_the_call(lambda v, source=source: balance_iterator(**source, config=reorder, layout=LAYOUT, micro_batch_size=2,
                                                                      image_token_id=IMAGE_TOKEN_ID, pad_values={}, seq_length=64,
                                                                      consumed_microbatches=v),
                            "consumed_microbatches", value)


@pytest.mark.parametrize("value", [6.0, "6", True], ids=repr)
def test_a_restored_position_that_is_not_an_integer_is_refused(value):
    """A state whose count is not an integer (edited, or written by hand) is refused when it is loaded."""
    loader = graph_loader()
    try:
        state = loader.state_dict()
        state[GraphLoader.CONSUMED_KEY] = value
        with pytest.raises(StateMismatchError, match=f"the saved state's {GraphLoader.CONSUMED_KEY} is missing or not a count"):
            loader.load_state_dict(state)
    finally:
        loader.close()


def graph_loader() -> GraphLoader:
    return vlm_sft.pipeline(SyntheticProcessedDataset(32), config(), LAYOUT, map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values={})


@pytest.mark.parametrize("value", NOT_COUNTS, ids=repr)
def test_megatrons_conversions_refuse_it_naming_the_argument(value):
    sizes = {"global_batch_size": 8, "micro_batch_size": 2, "data_parallel_size": 2}
    refused_at_the_call(lambda v: microbatches_from_samples(consumed_train_samples=v, **sizes), "consumed_train_samples", value)
    refused_at_the_call(lambda v: samples_from_microbatches(consumed_microbatches=v, **sizes), "consumed_microbatches", value)
    for name in sizes:
        refused_at_the_call(lambda v, name=name: microbatches_from_samples(consumed_train_samples=8, **{**sizes, name: v}), name, value)


@pytest.mark.parametrize("value", SAME_COUNTS, ids=repr)
def test_megatrons_conversions_take_numpy_and_torch_integers(value):
    sizes = {"global_batch_size": 8, "micro_batch_size": 2, "data_parallel_size": 2}
    assert microbatches_from_samples(consumed_train_samples=value * 4, **sizes) == 6
    assert microbatches_from_samples(consumed_train_samples=24, global_batch_size=value * 2, micro_batch_size=value // 3,
                                     data_parallel_size=np.int64(2)) == 6
    assert samples_from_microbatches(consumed_microbatches=value, **sizes) == 24
    assert global_microbatch_size(micro_batch_size=value, data_parallel_size=torch.tensor(2)) == 12


@pytest.mark.parametrize("name", PipelineConfig.COUNTS)
@pytest.mark.parametrize("value", [8.0, "8", True], ids=repr)
def test_the_configs_integer_settings_refuse_it_naming_the_field(name, value):
    """In Python the field (micro_batch_size), inside a command the flag (--micro-batch-size)."""
    least = PipelineConfig.COUNTS[name]
    for naming, setting in ((contextlib.nullcontext, name), (flag_names, cli_flag(name))):
        with naming():
            with pytest.raises(ConfigError, match=f"^{setting}: must be an integer >= {least}, got {re.escape(repr(value))} "):
                PipelineConfig(**{name: value})
            settings = PipelineConfig()
            setattr(settings, name, value)  # set after construction: validate refuses it too
            with pytest.raises(ConfigError, match=f"^{setting}: must be an integer >= {least}, got "):
                settings.validate()


@pytest.mark.parametrize("name", PipelineConfig.COUNTS)
def test_the_configs_integer_settings_below_their_least_value_are_refused_when_given(name):
    """seed -1, embedded_samples -1, global_batch_size -1: refused at construction with the range as the reason,
    not later inside a rank (numpy's "expected non-negative integer") or with a wrong reason ("not a multiple")."""
    least = PipelineConfig.COUNTS[name]
    with pytest.raises(ConfigError, match=f"^{name}: must be an integer >= {least}, got {least - 1}$"):
        PipelineConfig(**{name: np.int64(least - 1)})
    assert getattr(PipelineConfig(**{name: np.int64(least)}), name) == least


@pytest.mark.parametrize("name", ReorderConfig.COUNTS)
def test_the_reorder_configs_integer_settings_refuse_floats_and_take_numpy(name):
    with pytest.raises(ConfigError, match=f"^{name}: must be an integer >= 1, got 2.0"):
        ReorderConfig(**{name: 2.0})
    with pytest.raises(ConfigError, match=f"^{name}: must be an integer >= 1, got 0$"):
        ReorderConfig(**{name: 0})
    assert type(getattr(ReorderConfig(**{name: np.int64(2)}), name)) is int


def test_numpy_settings_become_ints_and_validate():
    settings = PipelineConfig(components=("language=dp=2",), micro_batch_size=np.int64(8), global_batch_size=torch.tensor(16),
                              seq_length=np.int32(256), seed=np.int64(3))
    assert settings.validate(2).world_size == 2
    assert all(type(getattr(settings, name)) is int for name in ("micro_batch_size", "global_batch_size", "seq_length", "seed"))


@pytest.mark.parametrize("options", [JobOptions, TrainOptions])
def test_the_jobs_counts_refuse_floats_and_take_numpy(options):
    for name in options.COUNTS:
        with pytest.raises(ConfigError, match=f"^--{name.replace('_', '-')}: must be an integer, got 4.0"), flag_names():
            options(**{name: 4.0})
        assert type(getattr(options(**{name: np.int64(4)}), name)) is int
    assert options(stop_after=None).stop_after is None


@pytest.mark.parametrize(("fields", "words"), [
    ({"pad_to_seq_length": "false"}, "pad_to_seq_length: must be True or False, got 'false' (a str)"),
    ({"drop_last": 0}, "drop_last: must be True or False, got 0 (a int)"),
    ({"reorder": ReorderConfig(scalable_dp=True)}, None),
    ({"components": "language=dp=1"}, "components: must be a list of module specs (strings), got 'language=dp=1'"),
    ({"exchange_timeout_s": "5"}, "exchange_timeout_s: must be a positive number of seconds, got '5'"),
    ({"exchange_timeout_s": float("inf")}, "exchange_timeout_s: must be a positive number of seconds, got inf"),
])
def test_settings_of_another_kind_are_refused_when_given(fields, words):
    """'false' is true to Python, a string of specs iterates by character, a timeout of '5' failed as a bare
    comparison and inf later in a timedelta: each refused at once, naming the setting."""
    if words is None:
        assert PipelineConfig(**fields).reorder.scalable_dp is True
        return
    with pytest.raises(ConfigError) as raised:
        PipelineConfig(**fields)
    assert str(raised.value) == words


def test_reorder_switches_are_booleans():
    with pytest.raises(ConfigError, match=r"^intra_microbatch_reorder: must be True or False, got 'yes' \(a str\)$"):
        ReorderConfig(intra_microbatch_reorder="yes")
    assert ReorderConfig(scalable_dp=np.bool_(True)).scalable_dp is True
