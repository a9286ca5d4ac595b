"""The Megatron-Bridge integration against Megatron-Bridge 0.6.2 itself (the Python 3.12 tier, after
scripts/setup312.sh installs it): Bridge's own checkpoint-manager factory takes :class:`PipelineCheckpointManager`, Bridge's
forward-step wrapper injects its state into :func:`forward_step`, which hands a ``MimoModel`` the pipeline's
micro-batch through ``mimo_batch`` and takes Bridge's own loss, and Bridge's config classes map to the pipeline's.
Skipped where Bridge is not installed (the 3.11 tier)."""

from __future__ import annotations

import importlib.util
import inspect
from functools import partial
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron.bridge") is None,
                                reason="Megatron-Bridge is not installed (scripts/setup312.sh installs it into .venv312)")


@pytest.fixture(scope="module")
def bridge_modules():
    from bridge_cpu import import_bridge

    import_bridge()
    from megatron.bridge.training import checkpointing, megatron_mimo_step
    from megatron.bridge.training.utils import train_utils

    return SimpleNamespace(checkpointing=checkpointing, step=megatron_mimo_step, train_utils=train_utils)


def test_bridge_factory_builds_the_pipeline_checkpoint_manager(bridge_modules, tmp_path) -> None:
    from mimo_pipes_recipes import megatron_bridge as bridge

    cfg = SimpleNamespace(checkpoint=bridge_modules.checkpointing.CheckpointConfig(save=str(tmp_path), load=str(tmp_path)))
    bridge.use_pipeline_checkpoints(cfg)
    manager = bridge_modules.checkpointing.create_checkpoint_manager(cfg.checkpoint)
    assert isinstance(manager, bridge.PipelineCheckpointManager)
    assert isinstance(manager, bridge_modules.checkpointing.CheckpointManager)  # Bridge's protocol check passed too
    assert isinstance(manager.default, bridge_modules.checkpointing.DefaultCheckpointManager)


def test_bridge_resume_call_reaches_build_data_iterators(bridge_modules) -> None:
    """Bridge's set-up refuses to resume through a builder whose signature lacks ``train_state``: the partial a
    recipe passes keeps it."""
    from mimo_pipes.config import PipelineConfig
    from mimo_pipes_recipes import megatron_bridge as bridge

    builder = partial(bridge.build_data_iterators, pipeline=PipelineConfig())
    assert "train_state" in inspect.signature(builder).parameters


def stand_in_model(role):
    """megatron-core's MimoModel without its layers: records what it is called with and returns a per-token loss of
    the labels' shape, as MimoModel does on the language model's last stage."""
    from megatron.core.models.mimo import MimoModel

    class StandIn(MimoModel):
        def __init__(self) -> None:
            torch.nn.Module.__init__(self)
            self.role = role
            self.calls = []

        def forward(self, **kwargs):
            inspect.signature(MimoModel.forward).bind(self, **kwargs)  # refuses a key MimoModel lacks
            self.calls.append(kwargs)
            return torch.arange(kwargs["labels"].numel(), dtype=torch.float32).view(kwargs["labels"].shape), None

    return StandIn()


def test_forward_step_feeds_mimo_batch_and_takes_bridge_loss(bridge_modules) -> None:
    from megatron.core.models.mimo.config.role import RankRole

    from mimo_pipes.config import PipelineConfig
    from mimo_pipes.exchange import RankLayout
    from mimo_pipes.megatron import mimo_batch
    from mimo_pipes.megatron.settings import MimoBatchSettings
    from mimo_pipes_recipes import megatron_bridge as bridge
    from mimo_pipes_recipes import vlm_sft

    config = PipelineConfig(components=("language=dp=1",), micro_batch_size=2, seq_length=2048, embedded_samples=8, num_workers=1)
    config.validate(world_size=1)
    vlm_sft.prepare(config, log=lambda _line: None)
    settings = MimoBatchSettings.for_processor(vlm_sft.open_processor(config), modality="images", encoder_key="qwen_visual")
    loader = bridge.BridgeLoader(vlm_sft.build(config, RankLayout(dp_rank=0, dp_size=1, grid_size=1)), config, settings, cfg=None)
    reference = vlm_sft.build(config, RankLayout(dp_rank=0, dp_size=1, grid_size=1))
    try:
        model = stand_in_model(RankRole.build(["images"], None))  # colocated: every module on this rank
        step = bridge_modules.train_utils.prepare_forward_step_func(bridge.forward_step, SimpleNamespace(name="state"))
        output, loss = step(loader, model)
        expected = mimo_batch(next(iter(reference)), settings, stage="only")
    finally:
        loader.close()
        reference.close()
    (given,) = model.calls
    assert set(given) == set(expected)
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(given[key], value), key
    assert given["modality_inputs"]["images"]["qwen_visual"]["hidden_states"].shape[0] > 0
    total, tokens, report = loss(output)
    mask = expected["loss_mask"].float()
    assert int(tokens) == int(mask.sum()) and torch.isclose(total, (output * mask).sum())
    assert torch.equal(report["lm loss"], bridge_modules.step.loss_func(expected["loss_mask"], output)[2]["lm loss"])


def test_bridge_config_classes_map_to_the_pipeline(bridge_modules) -> None:
    from megatron.bridge.training.config import RNGConfig, TrainingConfig

    from mimo_pipes_recipes import megatron_bridge as bridge

    grids = {name: SimpleNamespace(shape=[1, 1, dp, 1], dim_names=["tp", "cp", "dp", "pp"], rank_offset=offset)  # Bridge's builder's order
             for name, dp, offset in (("images", 1, 0), ("language", 2, 1))}
    cfg = SimpleNamespace(train=TrainingConfig(micro_batch_size=4, global_batch_size=8, train_iters=2), data_parallel_size=1, rng=RNGConfig(seed=11),
                          dataset=SimpleNamespace(seq_length=640, dataloader_type="cyclic", num_workers=0))
    config = bridge.pipeline_config(cfg, grids)
    assert (config.micro_batch_size, config.global_batch_size, config.seq_length, config.seed, config.num_workers) == (4, 8, 640, 11, 1)
    assert config.validate(3).grid_size == 2


def test_bridge_loads_no_torch_format_checkpoint(bridge_modules, tmp_path) -> None:
    """Why the integration requires ``torch_dist``: Bridge 0.6.2's load (``_load_checkpoint_from_path``) refuses a
    ``torch`` checkpoint before reading anything (its save writes one through megatron-core's dist_checkpointing)."""
    cfg = SimpleNamespace(checkpoint=SimpleNamespace(ckpt_format="torch", load=str(tmp_path)))
    with pytest.raises(NotImplementedError, match="Checkpoint format 'torch' is not supported"):
        bridge_modules.checkpointing._load_checkpoint_from_path(str(tmp_path), SimpleNamespace(cfg=cfg), [], None, None,
                                                               pg_collection=SimpleNamespace())


@pytest.mark.parametrize("ckpt_format", ["torch", "fsdp_dtensor"])
def test_use_pipeline_checkpoints_refuses_a_format_the_mimo_loop_cannot_resume(bridge_modules, ckpt_format) -> None:
    from mimo_pipes.errors import ConfigError
    from mimo_pipes_recipes import megatron_bridge as bridge

    cfg = SimpleNamespace(checkpoint=bridge_modules.checkpointing.CheckpointConfig(ckpt_format=ckpt_format))
    with pytest.raises(ConfigError) as refused:
        bridge.use_pipeline_checkpoints(cfg)
    message = str(refused.value)
    assert "checkpoint.ckpt_format" in message and repr(ckpt_format) in message and "'torch_dist'" in message and "\n" not in message
    assert cfg.checkpoint.custom_manager_class is None  # nothing set
