"""Into Megatron-Bridge's MIMO training loop: the pipeline as its data path, its state inside Bridge's checkpoints.

``pretrain_megatron_mimo(cfg, forward_step_func, build_data_iterators_fn)`` takes both the data iterators and the
forward step from its caller. Bridge's own pair gives every data rank the same global micro-batch and slices it per
module DP rank in the forward step; the pair here gives each rank its own balanced share instead:

- :func:`build_data_iterators` (``build_data_iterators_fn``): each rank's loader from Bridge's config and the module
  grids Bridge built (``cfg.model._grids``, or ``megatron_mimo_infra.module_to_grid_map``), Bridge's global
  micro-batch, sequence length, seed and loader settings (:func:`pipeline_config`); on resume it restores the loader
  state saved in Bridge's checkpoint iteration, or, for a checkpoint saved without it, starts at Bridge's
  ``train_state.consumed_train_samples``.
- :func:`forward_step` (``forward_step_func``): Bridge's MIMO forward step, with the rank's micro-batch made
  ``MimoModel.forward``'s keyword arguments by :func:`~mimo_pipes.megatron.mimo_batch` for its stage, not sliced.
- :class:`PipelineCheckpointManager` (``cfg.checkpoint.custom_manager_class``, set by :func:`use_pipeline_checkpoints`):
  Bridge's default checkpoint manager, which first writes every rank's loader state into the iteration folder
  (:func:`~mimo_pipes.megatron.checkpoint.save_pipeline_state`), so Bridge's tracker commits both at once, and
  saves and loads every module's optimizer state (:mod:`~mimo_pipes.megatron.optimizer_common`), so that a resume
  continues exactly. Checkpoints must be ``torch_dist`` (:data:`RESUMABLE_FORMAT`).

Bridge is imported only inside these functions; :func:`bridge_problem` is the version rule, checked before
anything is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from functools import lru_cache, partial
from typing import Any

import torch

from mimo_pipes.config import PipelineConfig
from mimo_pipes.errors import ConfigError
from mimo_pipes.megatron.batch import mimo_batch
from mimo_pipes.megatron.checkpoint import load_pipeline_state, pipeline_state_folder, save_pipeline_state
from mimo_pipes.megatron.consumed import microbatches_from_samples
from mimo_pipes.megatron.device import to_device
from mimo_pipes.megatron.forward import release
from mimo_pipes.megatron.grids import grid_layout, rank_layout
from mimo_pipes.megatron.optimizer_common import with_every_module_common_state
from mimo_pipes.megatron.settings import MimoBatchSettings
from mimo_pipes.megatron.stages import FIRST, LAST, MIDDLE, ONLY
from mimo_pipes_recipes import vlm_sft

BRIDGE = "megatron-bridge"
ACCEPTED_RELEASES = ((0, 6),)
"""Bridge release lines whose ``pretrain_megatron_mimo``, MIMO forward step and checkpoint manager this module
follows (0.6.2 is the one tested); the MIMO loop first shipped in 0.6 and its calls may change in 0.7."""
LANGUAGE = "language"  # megatron-core's fixed key of the language module
MANAGER = "mimo_pipes_recipes.megatron_bridge.PipelineCheckpointManager"
RESUMABLE_FORMAT = "torch_dist"
"""The one ``checkpoint.ckpt_format`` Bridge 0.6.2's MIMO loop both saves and loads (``checkpointing.py``,
``_load_checkpoint_from_path``: ``torch_dist`` or ``fsdp_dtensor``; the latter only under Megatron FSDP)."""
NO_DATA = dict.fromkeys(("input_ids", "position_ids", "attention_mask", "labels", "loss_mask", "modality_inputs"))


class BridgeVersionError(ConfigError):
    """The installed Megatron-Bridge is not one this integration follows."""

    def __init__(self, message: str) -> None:
        super().__init__(BRIDGE, message)


def bridge_problem(installed: str | None) -> str | None:
    """Why Bridge release ``installed`` (None: not installed) cannot be used (None: it can)."""
    accepted = " or ".join(f"{major}.{minor}.x" for major, minor in ACCEPTED_RELEASES)
    if installed is None:
        return f"needs Megatron-Bridge {accepted} (Python 3.12); it is not installed"
    try:
        line = release(installed)
    except ValueError:
        return f"cannot read the Megatron-Bridge version {installed!r}; needs {accepted}"
    if line not in ACCEPTED_RELEASES:
        return f"needs Megatron-Bridge {accepted}; installed {installed} (its MIMO loop's calls are followed release by release)"
    return None


@lru_cache(maxsize=1)
def installed_bridge() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(BRIDGE)
    except PackageNotFoundError:
        return None


def require_bridge() -> None:
    """BridgeVersionError (one line) unless the installed Bridge is an accepted release."""
    problem = bridge_problem(installed_bridge())
    if problem is not None:
        raise BridgeVersionError(problem)


# ------------------------------------------------------------------------------------------------ config


def pipeline_config(cfg: Any, grids: Mapping[str, Any], pipeline: PipelineConfig | None = None) -> PipelineConfig:
    """``pipeline`` (default: the embedded data and processor) with what Bridge's ``ConfigContainer`` says: the
    layout of the module grids, the global micro-batch ``cfg.train.micro_batch_size x cfg.data_parallel_size``
    (Bridge's MIMO loop sets the latter to 1: its micro-batch is global), ``cfg.train.global_batch_size``,
    ``cfg.dataset.seq_length``, ``cfg.rng.seed``, ``cfg.dataset.num_workers`` and ``dataloader_type``. Only
    attributes are read. ConfigError naming the Bridge setting for one the pipeline cannot take."""
    base = pipeline if pipeline is not None else PipelineConfig()
    micro_batch_size = _count(cfg.train.micro_batch_size, "train.micro_batch_size") * _count(getattr(cfg, "data_parallel_size", 1) or 1, "data_parallel_size")
    loader_type = getattr(cfg.dataset, "dataloader_type", None) or base.dataloader_type
    if loader_type not in ("single", "cyclic"):
        raise ConfigError("dataset.dataloader_type", f"{loader_type!r}: the pipeline reads single or cyclic (it is the loader: 'external' has no meaning here)")
    workers = getattr(cfg.dataset, "num_workers", None)
    return dataclasses.replace(
        base,
        components=grid_layout(grids, micro_batch_size=micro_batch_size).components,
        micro_batch_size=micro_batch_size,
        global_batch_size=_count(cfg.train.global_batch_size, "train.global_batch_size"),
        seq_length=_count(cfg.dataset.seq_length, "dataset.seq_length"),
        seed=int(cfg.rng.seed),
        num_workers=max(int(workers), 1) if workers is not None else base.num_workers,
        dataloader_type=loader_type,
    )


def _count(value: Any, setting: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(setting, f"must be an integer >= 1, got {value!r}")
    return value


def consumed_microbatches(cfg: Any, train_state: Any) -> int:
    """The pipeline's consumed micro-batches for Bridge's ``train_state.consumed_train_samples``."""
    return microbatches_from_samples(consumed_train_samples=int(train_state.consumed_train_samples), global_batch_size=cfg.train.global_batch_size,
                                     micro_batch_size=cfg.train.micro_batch_size, data_parallel_size=getattr(cfg, "data_parallel_size", 1) or 1)


def batch_settings(provider: Any, processor: Any, *, is_language: bool) -> MimoBatchSettings:
    """``mimo_batch``'s settings from Bridge's ``MegatronMIMOProvider``: its one modality and that modality's one
    encoder name the ``modality_inputs`` entry; its special token must be the processor's placeholder."""
    tokens = dict(getattr(provider, "special_token_ids", None) or {})
    specs = dict(getattr(provider, "modality_submodules_spec", None) or {})
    if len(specs) != 1:
        raise ConfigError("model.modality_submodules_spec", f"the pipeline feeds one vision modality, the provider has {sorted(specs) or 'none'}")
    modality, spec = next(iter(specs.items()))
    encoders = list((getattr(spec, "submodules", None) or {}).get("encoders") or {})
    if len(encoders) != 1:
        raise ConfigError("model.modality_submodules_spec", f"{modality}: the pipeline feeds one encoder, the spec has {encoders or 'none'}")
    settings = MimoBatchSettings.for_processor(processor, modality=modality, encoder_key=encoders[0], mrope=is_language)
    if tokens.get(modality) != settings.image_token_id:
        raise ConfigError("model.special_token_ids", f"{modality}: {tokens.get(modality)!r}, the processor's image placeholder is {settings.image_token_id}")
    return settings


# ------------------------------------------------------------------------------------------------ loaders


class BridgeLoader:
    """A rank's loader as Bridge's data iterator: the micro-batches, and what the forward step and the checkpoint
    manager read beside them (the pipeline settings, ``mimo_batch``'s settings, Bridge's config)."""

    def __init__(self, loader: Any, config: PipelineConfig, settings: MimoBatchSettings, cfg: Any) -> None:
        self.loader, self.config, self.settings, self.cfg = loader, config, settings, cfg
        self._iterator: Iterator[dict] | None = None

    def __iter__(self) -> BridgeLoader:
        return self

    def __next__(self) -> dict:
        if self._iterator is None:
            self._iterator = iter(self.loader)
        return next(self._iterator)

    def close(self) -> None:
        self.loader.close()


def build_data_iterators(cfg: Any, megatron_mimo_infra: Any, *, train_state: Any = None, pipeline: PipelineConfig | None = None,
                         valid: PipelineConfig | None = None) -> tuple[BridgeLoader, BridgeLoader | None]:
    """Bridge's ``build_data_iterators_fn`` (bind ``pipeline`` / ``valid`` with functools.partial): this rank's
    train loader, resumed at ``train_state`` (Bridge passes it when it resumes), and a validation loader over
    ``valid`` (None: none). A collective: every rank calls it, as Bridge does."""
    require_bridge()
    grids = getattr(cfg.model, "_grids", None) or megatron_mimo_infra.module_to_grid_map
    config = pipeline_config(cfg, grids, pipeline)
    module = next(name for name, collection in megatron_mimo_infra.pg_collections.items() if collection is not None)
    settings = batch_settings(cfg.model, vlm_sft.open_processor(config), is_language=module == LANGUAGE)
    train = _loader(config, grids, cfg, settings, resume=_resume_state(cfg, config, train_state))
    validation = None
    if valid is not None:
        validation = _loader(pipeline_config(cfg, grids, valid), grids, cfg, settings, resume=None)
    return train, validation


def _loader(config: PipelineConfig, grids: Mapping[str, Any], cfg: Any, settings: MimoBatchSettings, *, resume: Any) -> BridgeLoader:
    config.validate(torch.distributed.get_world_size())
    if torch.distributed.get_rank() == 0:
        vlm_sft.prepare(config, log=lambda _line: None)
    torch.distributed.barrier()
    layout = rank_layout(grids, micro_batch_size=config.micro_batch_size)
    consumed = resume if isinstance(resume, int) else 0
    loader = vlm_sft.build(config, layout, consumed_microbatches=consumed)
    if isinstance(resume, dict):
        loader.load_state_dict(resume)
    return BridgeLoader(loader, config, settings, cfg)


def _resume_state(cfg: Any, config: PipelineConfig, train_state: Any) -> dict | int | None:
    """Where the train loader starts: the loader state saved in the iteration Bridge loaded, else (a checkpoint
    saved without it) Bridge's consumed samples as micro-batches; None: from the start."""
    if train_state is None or int(train_state.step) == 0:
        return None
    consumed = consumed_microbatches(cfg, train_state)
    load = getattr(cfg.checkpoint, "load", None)
    iteration = int(train_state.step)
    if load is None or not pipeline_state_folder(load, iteration).is_dir():
        return consumed
    return load_pipeline_state(load, iteration, config=config, consumed_microbatches=consumed)


# ------------------------------------------------------------------------------------------------ forward step


def forward_step(state: Any, data_iterator: BridgeLoader, model: Any) -> tuple[Any, Any]:
    """Bridge's MIMO forward step (``megatron_mimo_step.forward_step``) on this rank's own balanced micro-batch:
    ``mimo_batch`` for its language stage replaces Bridge's global slice; the loss is Bridge's ``loss_func``."""
    from megatron.bridge.training.megatron_mimo_parallel_utils import unwrap_megatron_mimo_model
    from megatron.bridge.training.megatron_mimo_step import loss_func

    role = unwrap_megatron_mimo_model(model).role
    stage, needs_data = _stage(role)
    if needs_data:
        kwargs = mimo_batch(next(data_iterator), data_iterator.settings, stage=stage)
        kwargs = to_device(kwargs, torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    else:
        kwargs = dict(NO_DATA)
    output = model(**kwargs)
    loss_mask = kwargs.get("loss_mask")
    if isinstance(output, tuple):
        output, returned_mask = output
        loss_mask = returned_mask if returned_mask is not None else loss_mask
    if stage not in (ONLY, LAST) or (role is not None and not role.has_language_module):
        return output, None
    if isinstance(output, dict):
        raise ValueError(f"the language model's last stage returned activations ({', '.join(output)}), not a per-token loss")
    return output, partial(loss_func, loss_mask if loss_mask is not None else torch.ones_like(output))


def _stage(role: Any) -> tuple[str, bool]:
    """(the rank's language stage, whether it reads data): a language stage reads on every stage (positions), a
    modality module on its first stage only, as Bridge's step does."""
    if role is None:
        return ONLY, True
    if role.has_language_module:
        first, last = role.is_first_stage(LANGUAGE), role.is_last_stage(LANGUAGE)
        return (ONLY if first and last else FIRST if first else LAST if last else MIDDLE), True
    return ONLY, any(role.is_first_stage(name) for name in role.modality_module_names)


# ------------------------------------------------------------------------------------------------ checkpoints


def checkpoint_format_problem(ckpt_format: Any) -> str | None:
    """Why Bridge's MIMO loop cannot resume from checkpoints of ``ckpt_format`` (None: it can)."""
    if ckpt_format == RESUMABLE_FORMAT:
        return None
    return (f"{ckpt_format!r}: Megatron-Bridge 0.6's MIMO loop resumes only from {RESUMABLE_FORMAT!r} checkpoints "
            "(it loads no 'torch' checkpoint; 'fsdp_dtensor' needs Megatron FSDP)")


def use_pipeline_checkpoints(cfg: Any) -> None:
    """Make Bridge save the pipeline's state in its checkpoints: ``cfg.checkpoint.custom_manager_class`` names
    :class:`PipelineCheckpointManager` (allowed through Bridge's target allow-list). ConfigError naming
    ``checkpoint.ckpt_format`` for a format the MIMO loop cannot resume from."""
    from megatron.bridge.utils.instantiate_utils import register_allowed_target_prefix

    require_bridge()
    problem = checkpoint_format_problem(cfg.checkpoint.ckpt_format)
    if problem is not None:
        raise ConfigError("checkpoint.ckpt_format", problem)
    register_allowed_target_prefix("mimo_pipes_recipes.")
    cfg.checkpoint.custom_manager_class = MANAGER


class PipelineCheckpointManager:
    """Bridge's ``DefaultCheckpointManager``, saving the train loader's state into each persistent checkpoint's
    iteration folder before Bridge writes the rest and commits the iteration (its tracker file), and handing
    Bridge's save and load the ``MimoOptimizer`` with every module's common state sharded by module
    (:mod:`~mimo_pipes.megatron.optimizer_common`: ``torch_dist`` keeps global rank 0's alone)."""

    def __init__(self, checkpoint_config: Any) -> None:
        from megatron.bridge.training.checkpointing import DefaultCheckpointManager

        self.checkpoint_config = checkpoint_config
        self.default = DefaultCheckpointManager(checkpoint_config)

    @property
    def checkpointing_context(self) -> dict[str, Any]:
        return self.default.checkpointing_context

    def save(self, ctx: Any, callback_manager: Any) -> None:
        loader = ctx.train_data_iterator
        if isinstance(loader, BridgeLoader) and not ctx.non_persistent_ckpt and self.checkpoint_config.save:
            save_pipeline_state(self.checkpoint_config.save, int(ctx.state.train_state.step), loader.loader.state_dict(), config=loader.config,
                                consumed_microbatches=consumed_microbatches(loader.cfg, ctx.state.train_state))
        self.default.save(dataclasses.replace(ctx, optimizer=with_every_module_common_state(ctx.optimizer)), callback_manager)

    def load(self, ctx: Any) -> tuple[int, int]:
        return self.default.load(dataclasses.replace(ctx, optimizer=with_every_module_common_state(ctx.optimizer)))

    def finalize_async_saves(self, state: Any, blocking: bool = False, terminate: bool = False) -> None:
        self.default.finalize_async_saves(state, blocking=blocking, terminate=terminate)
