"""The Megatron-Bridge integration's pure logic, without Bridge: its version and checkpoint-format rules, Bridge's config mapped to the
pipeline's, the consumed count from Bridge's train state, and ``mimo_batch``'s settings from Bridge's provider.
Bridge's config objects are stood in for by plain namespaces holding the attributes the mapping reads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mimo_pipes.config import PipelineConfig
from mimo_pipes.errors import ConfigError
from mimo_pipes.megatron.grids import GridMapError
from mimo_pipes_recipes.megatron_bridge import (
    ACCEPTED_RELEASES,
    RESUMABLE_FORMAT,
    batch_settings,
    bridge_problem,
    checkpoint_format_problem,
    consumed_microbatches,
    pipeline_config,
)


def grid(shape: list[int], offset: int) -> SimpleNamespace:
    """A module grid as Bridge builds it (dim_names tp, cp, dp, pp), by its attributes."""
    return SimpleNamespace(shape=shape, dim_names=["tp", "cp", "dp", "pp"], rank_offset=offset)


GRIDS = {"images": grid([1, 1, 1, 1], 0), "language": grid([1, 1, 2, 1], 1)}


def bridge_cfg(micro_batch_size: int = 4, global_batch_size: int = 8, dp: int = 1, seq_length: int = 512, seed: int = 7,
               dataloader_type: str | None = "single", num_workers: int = 2) -> SimpleNamespace:
    return SimpleNamespace(
        train=SimpleNamespace(micro_batch_size=micro_batch_size, global_batch_size=global_batch_size),
        data_parallel_size=dp,
        dataset=SimpleNamespace(seq_length=seq_length, dataloader_type=dataloader_type, num_workers=num_workers),
        rng=SimpleNamespace(seed=seed),
        checkpoint=SimpleNamespace(load=None),
    )


@given(st.integers(0, 3), st.integers(0, 12), st.integers(0, 9), st.sampled_from(["", "rc1", ".dev0", "+cu12"]))
def test_version_rule_accepts_exactly_the_release_lines(major: int, minor: int, patch: int, suffix: str) -> None:
    problem = bridge_problem(f"{major}.{minor}.{patch}{suffix}")
    assert (problem is None) == ((major, minor) in ACCEPTED_RELEASES)
    if problem is not None:
        assert "\n" not in problem and f"{major}.{minor}.{patch}" in problem


def test_version_rule_names_a_missing_or_unreadable_release() -> None:
    assert "not installed" in bridge_problem(None)
    assert "cannot read" in bridge_problem("nightly")
    assert bridge_problem("0.6.2") is None


def test_config_takes_bridge_sizes_and_the_layout_of_its_grids() -> None:
    base = PipelineConfig(embedded_samples=16, seed=1, seq_length=2048, micro_batch_size=8)
    config = pipeline_config(bridge_cfg(), GRIDS, base)
    assert config.components == ("images=tp=1,cp=1,pp=1,dp=1,etp=1,rank_offset=0", "language=tp=1,cp=1,pp=1,dp=2,etp=1,rank_offset=1")
    assert (config.micro_batch_size, config.global_batch_size, config.seq_length, config.seed) == (4, 8, 512, 7)
    assert (config.dataloader_type, config.num_workers, config.embedded_samples) == ("single", 2, 16)
    assert base.micro_batch_size == 8  # the caller's settings are not modified
    assert config.validate(3).grid_size == 2


def test_config_global_micro_batch_is_per_rank_size_times_bridge_dp() -> None:
    assert pipeline_config(bridge_cfg(micro_batch_size=2, dp=2, global_batch_size=8), GRIDS).micro_batch_size == 4


@pytest.mark.parametrize(("cfg", "setting"), [
    (bridge_cfg(micro_batch_size=3, global_batch_size=6), "module_to_grid_map"),  # not a multiple of the lcm of the DP sizes
    (bridge_cfg(dataloader_type="external"), "dataset.dataloader_type"),
    (bridge_cfg(seq_length=0), "dataset.seq_length"),
    (bridge_cfg(global_batch_size=None), "train.global_batch_size"),
])
def test_config_refuses_bridge_settings_the_pipeline_cannot_take(cfg: SimpleNamespace, setting: str) -> None:
    with pytest.raises(ConfigError) as caught:
        pipeline_config(cfg, GRIDS)
    assert caught.value.setting == setting and "\n" not in str(caught.value)
    if setting == "module_to_grid_map":
        assert isinstance(caught.value, GridMapError)


@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 50))
def test_consumed_count_from_bridge_train_state(micro_batch_size: int, steps_per_batch: int, iterations: int) -> None:
    cfg = bridge_cfg(micro_batch_size=micro_batch_size, global_batch_size=micro_batch_size * steps_per_batch)
    state = SimpleNamespace(step=iterations, consumed_train_samples=iterations * micro_batch_size * steps_per_batch)
    assert consumed_microbatches(cfg, state) == iterations * steps_per_batch


def test_consumed_count_of_another_batch_size_is_refused() -> None:
    with pytest.raises(ConfigError, match="consumed_train_samples"):
        consumed_microbatches(bridge_cfg(micro_batch_size=4, global_batch_size=8), SimpleNamespace(step=1, consumed_train_samples=6))


def provider(tokens: dict[str, int], encoders: dict[str, list[str]]) -> SimpleNamespace:
    specs = {name: SimpleNamespace(submodules={"encoders": dict.fromkeys(keys)}) for name, keys in encoders.items()}
    return SimpleNamespace(special_token_ids=tokens, modality_submodules_spec=specs)


@pytest.fixture(scope="module")
def processor():
    from mimo_pipes.data.from_config import open_processor

    return open_processor(PipelineConfig(seq_length=512))


def test_batch_settings_name_the_provider_modality_and_encoder(processor) -> None:
    image = processor.family.image_token_id
    settings = batch_settings(provider({"vision": image}, {"vision": ["clip"]}), processor, is_language=False)
    assert (settings.modality, settings.encoder_key, settings.image_token_id, settings.mrope) == ("vision", "clip", image, False)
    assert batch_settings(provider({"vision": image}, {"vision": ["clip"]}), processor, is_language=True).mrope


@pytest.mark.parametrize(("tokens", "encoders", "setting"), [
    ({"vision": -1}, {"vision": ["clip"]}, "model.special_token_ids"),
    ({}, {"vision": ["clip"]}, "model.special_token_ids"),
    ({"vision": 0, "audio": 1}, {"vision": ["clip"], "audio": ["whisper"]}, "model.modality_submodules_spec"),
    ({"vision": 0}, {"vision": ["clip", "siglip"]}, "model.modality_submodules_spec"),
])
def test_batch_settings_refuse_a_provider_the_pipeline_cannot_feed(processor, tokens, encoders, setting) -> None:
    with pytest.raises(ConfigError) as caught:
        batch_settings(provider(tokens, encoders), processor, is_language=True)
    assert caught.value.setting == setting


def test_library_imports_without_bridge() -> None:
    import importlib.util

    import mimo_pipes_recipes.megatron_bridge as bridge

    if importlib.util.find_spec("megatron.bridge") is None:
        assert bridge.bridge_problem(bridge.installed_bridge()) is not None
        with pytest.raises(bridge.BridgeVersionError, match="Megatron-Bridge"):
            bridge.require_bridge()


def test_resume_prefers_the_loader_state_in_bridge_iteration_then_the_count(tmp_path) -> None:
    """Where the train loader starts: nothing at step 0; the loader state saved inside the iteration Bridge loaded;
    Bridge's consumed samples as micro-batches for an iteration saved without it."""
    from mimo_pipes.megatron.checkpoint import save_pipeline_state
    from mimo_pipes_recipes.megatron_bridge import _resume_state

    cfg = bridge_cfg(micro_batch_size=4, global_batch_size=8)
    cfg.checkpoint.load = str(tmp_path)
    config = PipelineConfig(components=("language=dp=1",), micro_batch_size=4, global_batch_size=8)
    assert _resume_state(cfg, config, SimpleNamespace(step=0, consumed_train_samples=0)) is None
    assert _resume_state(cfg, config, None) is None
    state = {"root": {"reader": 6}, "consumed_microbatches": 6}
    save_pipeline_state(tmp_path, 3, state, config=config, consumed_microbatches=6)
    assert _resume_state(cfg, config, SimpleNamespace(step=3, consumed_train_samples=24)) == state
    assert _resume_state(cfg, config, SimpleNamespace(step=5, consumed_train_samples=40)) == 10  # iter 5 has no pipeline state
    with pytest.raises(ConfigError, match="--load"):  # the state of iteration 3 stands elsewhere than its train state says
        _resume_state(cfg, config, SimpleNamespace(step=3, consumed_train_samples=32))
    cfg.checkpoint.load = None
    assert _resume_state(cfg, config, SimpleNamespace(step=3, consumed_train_samples=24)) == 6


@pytest.mark.parametrize("ckpt_format", ["torch", "fsdp_dtensor", "zarr", None])
def test_only_torch_dist_checkpoints_resume_in_bridges_mimo_loop(ckpt_format):
    assert checkpoint_format_problem(RESUMABLE_FORMAT) is None
    problem = checkpoint_format_problem(ckpt_format)
    assert problem.startswith(f"{ckpt_format!r}: ") and "'torch_dist'" in problem and "\n" not in problem
