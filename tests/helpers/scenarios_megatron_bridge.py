"""Scenarios of Megatron-Bridge 0.6.2's own MIMO loop (``pretrain_megatron_mimo``) fed by the pipeline through
:mod:`mimo_pipes_recipes.megatron_bridge`, on CPU ranks over Gloo (:mod:`bridge_cpu`), with the model, seed and
data of the non-colocated recipe's scenarios (:mod:`scenarios_megatron_equivalence`): the recipe's own model
specs handed to Bridge's ``MegatronMIMOProvider``, its settings to Bridge's ``ConfigContainer``, and the
integration wired by exactly the lines docs/megatron.md shows a Bridge user (:func:`documented_lines`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist
from scenarios_megatron_equivalence import megatron_scenario, settings, smaller_images

from mimo_pipes_recipes import megatron_bridge, vlm_sft
from mimo_pipes_recipes import megatron_mimo_grids as grids
from mimo_pipes_recipes import megatron_mimo_train as colocated

DOCS = Path(__file__).resolve().parents[2] / "docs" / "megatron.md"
SECTION = "## From Megatron-Bridge"


def bridge_config(args: Any, *, iterations: int, save: str | None, save_interval: int | None, load: str | None) -> Any:
    """Bridge's ``ConfigContainer`` for the recipe's ``args``: the provider over the recipe's model specs (fp32,
    built on the CPU), the recipe's Adam at a constant learning rate, its global micro-batch and window as
    Bridge's ``micro_batch_size`` (global in the MIMO loop) and ``global_batch_size``."""
    from megatron.bridge.data.megatron_mimo.hf_provider import HFMegatronMIMODatasetProvider
    from megatron.bridge.models.megatron_mimo import MegatronMIMOParallelismConfig, MegatronMIMOProvider
    from megatron.bridge.models.megatron_mimo.megatron_mimo_config import ModuleParallelismConfig
    from megatron.bridge.training.config import (
        CheckpointConfig,
        ConfigContainer,
        DistributedDataParallelConfig,
        LoggerConfig,
        OptimizerConfig,
        RNGConfig,
        SchedulerConfig,
        TrainingConfig,
    )
    from megatron.bridge.training.tokenizers.config import TokenizerConfig

    pipeline = grids.pipeline_config(args, "off", ("language=dp=1",))
    processor = vlm_sft.open_processor(pipeline)
    model = colocated.mimo_model_config(args, len(processor.tokenizer), processor.image_token_id)
    language = model.language_model_spec.params["config"]
    language.calculate_per_token_loss = True  # as the recipe: the loss per token of the iteration
    language.pipeline_dtype = language.params_dtype
    parallelism = MegatronMIMOParallelismConfig(module_parallelisms={
        colocated.MODALITY: ModuleParallelismConfig(data_parallel_size=args.images_dp, rank_offset=0),
        megatron_bridge.LANGUAGE: ModuleParallelismConfig(data_parallel_size=args.language_dp, rank_offset=args.images_dp)})
    provider = MegatronMIMOProvider(language_model_spec=model.language_model_spec, modality_submodules_spec=model.modality_submodules_spec,
                                    special_token_ids=model.special_token_ids, megatron_mimo_parallelism_config=parallelism,
                                    fp16=False, bf16=False, use_cpu_initialization=True)
    recipe_optimizer = colocated.optimizer_config(args)
    optimizer = OptimizerConfig(optimizer="adam", lr=args.lr, min_lr=args.lr, weight_decay=recipe_optimizer.weight_decay,
                                adam_beta1=recipe_optimizer.adam_beta1, adam_beta2=recipe_optimizer.adam_beta2, clip_grad=recipe_optimizer.clip_grad,
                                params_dtype=recipe_optimizer.params_dtype, use_distributed_optimizer=False, bf16=False, fp16=False)
    return ConfigContainer(
        model=provider,
        train=TrainingConfig(micro_batch_size=args.micro_batch_size, global_batch_size=args.micro_batch_size * args.microbatches,
                             train_iters=iterations),
        optimizer=optimizer,
        scheduler=SchedulerConfig(lr_decay_style="constant", lr_warmup_iters=0, start_weight_decay=0.0, end_weight_decay=0.0),
        ddp=DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False),
        dataset=HFMegatronMIMODatasetProvider(seq_length=args.seq_length, hf_dataset_path="unused", hf_tokenizer_path="unused",
                                              num_workers=args.num_workers, dataloader_type=pipeline.dataloader_type),
        logger=LoggerConfig(log_interval=1),
        tokenizer=TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=len(processor.tokenizer)),
        checkpoint=CheckpointConfig(save=save, save_interval=save_interval, load=load, ckpt_format="torch_dist", async_save=False),
        rng=RNGConfig(seed=args.seed),
    )


@contextlib.contextmanager
def losses_seen(into: list) -> Iterator[None]:
    """Bridge's ``training_log`` as its loop calls it, the loss dict it is handed recorded first (its last rank
    holds it: Bridge moves it there)."""
    from megatron.bridge.training import train_megatron_mimo

    logged = train_megatron_mimo.training_log

    def recording(*args: Any, **kwargs: Any) -> Any:
        loss = kwargs["loss_dict"].get("lm loss")
        if loss is not None:
            into.append(float(loss))
        return logged(*args, **kwargs)

    train_megatron_mimo.training_log = recording
    try:
        yield
    finally:
        train_megatron_mimo.training_log = logged


@contextlib.contextmanager
def gradients_cleared_each_step() -> Iterator[None]:
    """Not a CPU matter, a Megatron-Bridge 0.6.2 one: its MIMO step (``train_megatron_mimo.py``,
    ``train_step_megatron_mimo``) zeroes the DDP gradient buffers (``zero_grad_buffer_for_multimodule``) but never
    calls ``optimizer.zero_grad()``, which its standard ``train_step`` does. With fp32 parameters megatron-core's
    ``FP32Optimizer.prepare_grads`` leaves each ``param.grad`` aliasing its ``main_grad``, so from the second
    iteration on the first micro-batch's gradient is added twice (autograd into the alias, then DDP's hook adds
    ``param.grad`` to ``main_grad``); bf16 and fp16 (Bridge's default) keep separate main parameters and are not
    affected. While inside, the buffers' zeroing also clears each parameter's ``.grad``, as ``optimizer.zero_grad()``
    does: the recipe's step and Bridge's standard one."""
    from megatron.bridge.training import train_megatron_mimo
    from megatron.bridge.training.megatron_mimo_parallel_utils import is_current_rank_in_grid

    zero_buffers = train_megatron_mimo.zero_grad_buffer_for_multimodule

    def zero_buffers_and_grads(module_to_grid_tuple: list) -> None:
        zero_buffers(module_to_grid_tuple)
        for module, grid in module_to_grid_tuple:
            if module is not None and is_current_rank_in_grid(grid):
                for param in module.parameters():
                    param.grad = None

    train_megatron_mimo.zero_grad_buffer_for_multimodule = zero_buffers_and_grads
    try:
        yield
    finally:
        train_megatron_mimo.zero_grad_buffer_for_multimodule = zero_buffers


def documented_lines() -> str:
    """The lines docs/megatron.md's "From Megatron-Bridge" section adds to a Bridge MIMO recipe: the ``+`` lines of
    the section's first block, as the recipe runs them."""
    text = DOCS.read_text()
    section = text[text.index(f"\n{SECTION}\n"):]
    start = section.index("```text\n") + len("```text\n")
    block = section[start:section.index("\n```", start)]
    return "\n".join(line[2:] for line in block.splitlines() if line.startswith("+ "))


def bridge_run(*, images_dp: int, language_dp: int, reorder: str, iterations: int, save: str | None = None,
               save_interval: int | None = None, load: str | None = None) -> list[float] | None:
    """Bridge's ``pretrain_megatron_mimo`` with the integration's forward step, data iterators and checkpoint
    manager, wired by exactly the docs' lines (:func:`documented_lines`, run with the recipe's ``cfg``, ``pipeline``
    and ``pretrain_megatron_mimo``); the last rank returns each iteration's loss (Bridge's ``lm loss``), the
    others None."""
    from bridge_cpu import bridge_on_cpu, import_bridge

    pretrain = import_bridge().pretrain_megatron_mimo
    args = grids.parse_args([*settings(reorder, iterations), "--images-dp", str(images_dp), "--language-dp", str(language_dp)])
    with smaller_images():  # the recipe's data, as its scenarios read it
        recipe = {"cfg": bridge_config(args, iterations=iterations, save=save, save_interval=save_interval, load=load),
                  "pipeline": grids.pipeline_config(args, reorder, ("language=dp=1",)),  # the layout comes from Bridge's grids
                  "pretrain_megatron_mimo": pretrain}
    losses: list[float] = []
    try:
        with megatron_scenario(), bridge_on_cpu(), gradients_cleared_each_step(), losses_seen(losses):
            exec(compile(documented_lines(), f"{DOCS} ({SECTION})", "exec"), recipe)
    finally:
        _forget_bridge_globals()
    return losses if dist.get_rank() == dist.get_world_size() - 1 else None


def _forget_bridge_globals() -> None:
    """What Bridge's loop leaves set in the process (the micro-batch calculator), for the pool's next scenario."""
    from megatron.core import num_microbatches_calculator

    num_microbatches_calculator.destroy_num_microbatches_calculator()
