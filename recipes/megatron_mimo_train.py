"""Recipe: train megatron-core's ``MimoModel`` on the pipeline's micro-batches, on one GPU (or one CPU process).

The model is megatron-core's own: a ``GPTModel`` language model on local layer specs (no
TransformerEngine) with M-RoPE, and a ``VisionModalitySubmodules`` holding a Qwen2-VL-style vision
tower (transformers' architecture, random seeded weights) and a linear input projection to the language
model's width; the built-in processor's image placeholder is the modality's special token. megatron-core's
``DistributedDataParallel`` and ``get_megatron_optimizer`` (Adam) train it. The data is the default
recipe's graph (:mod:`mimo_pipes_recipes.vlm_sft`, the embedded synthetic VLM data unless ``--dataset``)
and every micro-batch reaches ``MimoModel.forward`` through :func:`mimo_pipes.megatron.mimo_batch` alone.

One iteration is one window of ``--microbatches`` micro-batches through megatron-core's own schedule without
pipelining (``forward_backward_no_pipelining``: the same forward step and per-token loss as the non-colocated
recipe's 1F1B schedule, :mod:`mimo_pipes.megatron.step`); its loss is the sum of the per-token losses over the
window divided by the window's loss tokens, so reordering the window's samples across its micro-batches leaves
it unchanged. Each micro-batch is taken when its forward starts, as Megatron's schedule takes it; ``--prefetch N``
(default 2) is the pipeline's read-ahead (``PipelineConfig.read_ahead``): the loader makes N micro-batches ahead on
its own thread and runs ``mimo_batch`` there (``GraphLoader.prepare_with``). Per iteration the log records
the loss, the time the training thread waited for its next micro-batch, the time :func:`mimo_batch` took,
and the model's time (the rest of the iteration: to the GPU, forward, backward, optimizer step;
CUDA-synchronised at its end)::

    python -m mimo_pipes_recipes.megatron_mimo_train --iterations 100 --reorder off,on --log-dir logs/

Needs megatron-core 0.18 or later (its ``MimoModel`` takes M-RoPE positions ``[3, B, S]``) and, by default, a CUDA
GPU (``--device cuda``, NCCL); ``--device cpu`` trains on the CPU over Gloo, slowly: the debugging and CI path
(megatron-core itself still assumes CUDA in places, which the project's tests stand in for). The non-colocated
layout is :mod:`mimo_pipes_recipes.megatron_mimo_grids`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.demo_model.encoders import encode, vision_tower_config
from mimo_pipes.errors import ConfigError, SampleError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.megatron import MimoBatchSettings, mimo_batch, require_mrope_and_packing
from mimo_pipes.megatron.device import DEVICES, TrainingDevice, init_distributed, to_device
from mimo_pipes.megatron.fit import seq_length_problem
from mimo_pipes.megatron.groups import module_grid, pg_collection
from mimo_pipes.megatron.step import forward_step, module_grad_norm, summed_loss
from mimo_pipes_recipes import vlm_sft

MODALITY = "images"
ENCODER_KEY = "qwen_visual"
COMPONENTS = ("language=tp=1,pp=1,dp=1,rank_offset=0",)  # one rank: every module on it (colocated)
REORDER_MODES = ("off", "on")


# ---------------------------------------------------------------------------------------------- settings


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = parser.add_argument_group("data")
    data.add_argument("--iterations", type=int, default=100, help="iterations per run (one window of micro-batches each)")
    data.add_argument("--micro-batch-size", type=int, default=4)
    data.add_argument("--microbatches", type=int, default=4, help="micro-batches per iteration (the reordering window)")
    data.add_argument("--seq-length", type=int, default=2048)
    data.add_argument("--num-workers", type=int, default=None,
                      help="threads that process the data (default: the cores a rank may use, less 2)")
    data.add_argument("--dataset", default=None, help="default: the embedded synthetic VLM data")
    data.add_argument("--embedded-samples", type=int, default=512)
    data.add_argument("--prefetch", type=int, default=2, help="micro-batches the loader reads ahead on its thread (the "
                      "pipeline's read_ahead; 0: read on the training thread, each when its forward starts)")
    data.add_argument("--pack-sequences-in-batch", action="store_true", help="pack each language micro-batch into one THD row "
                      "(PipelineConfig.pack_sequences_in_batch): attention by TransformerEngine's, the only one of megatron-core that takes it")
    data.add_argument("--pack-pad-multiple", type=int, default=1, metavar="K", help="with packing, pad every sequence to a multiple of K")
    data.add_argument("--reorder", default="off", help="comma-separated runs: off (plain order), on (--scalable-dp --intra-microbatch-reorder "
                      "--reorder-across-microbatches over the window); each run starts from the same weights")
    model = parser.add_argument_group("model")
    model.add_argument("--lm-layers", type=int, default=12)
    model.add_argument("--lm-hidden", type=int, default=1024)
    model.add_argument("--lm-heads", type=int, default=16)
    model.add_argument("--vision-depth", type=int, default=12)
    model.add_argument("--vision-width", type=int, default=768)
    model.add_argument("--vision-heads", type=int, default=12)
    model.add_argument("--lr", type=float, default=3e-4)
    model.add_argument("--seed", type=int, default=1234)
    model.add_argument("--device", choices=DEVICES, default="cuda", help="cuda: one GPU per rank over NCCL (the fast one); "
                       "cpu: CPU processes over Gloo (slow: for debugging and CI)")
    out = parser.add_argument_group("output")
    out.add_argument("--log-dir", default=".", help="where each run's JSON log goes (megatron_mimo_<reorder>.json)")
    args = parser.parse_args(argv)
    modes = [mode.strip() for mode in args.reorder.split(",") if mode.strip()]
    if not modes or any(mode not in REORDER_MODES for mode in modes):
        parser.error(f"--reorder: a comma-separated list of {', '.join(REORDER_MODES)}, got {args.reorder!r}")
    args.reorder_modes = modes
    if args.prefetch < 0:
        parser.error(f"--prefetch: must be >= 0, got {args.prefetch}")
    for name in ("iterations", "micro_batch_size", "microbatches", "seq_length", "pack_pad_multiple", "lm_layers", "lm_hidden", "lm_heads",
                 "vision_depth", "vision_width", "vision_heads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if args.lm_hidden % args.lm_heads or (args.lm_hidden // args.lm_heads) % 16:
        parser.error(f"--lm-hidden {args.lm_hidden} / --lm-heads {args.lm_heads}: the head width must be a multiple of 16 (M-RoPE's three sections)")
    if args.vision_width % args.vision_heads:
        parser.error(f"--vision-width {args.vision_width} is not a multiple of --vision-heads {args.vision_heads}")
    return args


def pipeline_config(args: argparse.Namespace, reorder: str) -> PipelineConfig:
    """The pipeline's settings for one rank holding every module; ``reorder`` ``on`` balances each window's
    samples over its micro-batches, ``off`` keeps the reading order. Both read the same samples per window."""
    balance = ReorderConfig(
        scalable_dp=True, intra_microbatch_reorder=True, reorder_across_microbatches=True, reorder_window_size=args.microbatches
    ) if reorder == "on" else ReorderConfig(reorder_window_size=args.microbatches)
    return PipelineConfig(
        components=COMPONENTS,
        micro_batch_size=args.micro_batch_size,
        global_batch_size=args.micro_batch_size * args.microbatches,
        seq_length=args.seq_length,
        num_workers=args.num_workers,
        dataset=args.dataset,
        embedded_samples=args.embedded_samples,
        seed=args.seed,
        reorder=balance,
        read_ahead=args.prefetch,  # the library's read-ahead: no thread of the recipe's own
        pack_sequences_in_batch=args.pack_sequences_in_batch,
        pack_pad_multiple=args.pack_pad_multiple,
    )


def mrope_section(head_dim: int) -> list[int]:
    """Qwen2-VL's split of the rotary half-width over (temporal, height, width): 16/24/24 of 64 (head 128),
    scaled to ``head_dim``."""
    if head_dim % 16:
        raise ValueError(f"head width {head_dim}: M-RoPE's sections (1/4, 3/8, 3/8 of half of it) need a multiple of 16")
    half = head_dim // 2
    return [half // 4, 3 * half // 8, 3 * half // 8]


def vision_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The tower's size: Qwen2-VL's patches (14 px, 2 frames, 2x2 merge), this width and depth."""
    return {"depth": args.vision_depth, "embed_dim": args.vision_width, "num_heads": args.vision_heads,
            "hidden_size": args.lm_hidden, "mlp_ratio": 4}


# ------------------------------------------------------------------------------------------------ model


class QwenVisionEncoder(torch.nn.Module):
    """The encoder of the vision submodule: a Qwen2-VL-style tower (``mimo_pipes.demo_model.encoders``) taking the
    keywords ``mimo_batch`` gives (``hidden_states``: patch rows, ``grid_thw``: one row per image) and
    returning one row per placeholder token.

    ``config`` is the transformer config its module's DDP is built with (megatron-core's per-token loss setting,
    bucket sizes): Megatron-Bridge wraps each modality in DDP over its first encoder's ``config`` and builds every
    encoder with its module's ``pg_collection`` (the tower is not split, so it needs none)."""

    def __init__(self, overrides: dict[str, Any], seed: int, config: Any = None, pg_collection: Any = None) -> None:
        super().__init__()
        self.config = config
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

        config = vision_tower_config("tiny", **overrides)
        config._attn_implementation = "sdpa"
        torch.manual_seed(seed)
        self.tower = Qwen2VisionTransformerPretrainedModel._from_config(config, dtype=torch.float32)
        self.out_features = config.hidden_size

    def forward(self, hidden_states: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        return encode(self.tower, hidden_states, grid_thw)


class InputProjection(torch.nn.Linear):
    """The vision submodule's projection to the language model's width: a linear layer that takes (and needs no)
    ``tp_group``, which Megatron-Bridge gives every input projection it builds."""

    def __init__(self, in_features: int, out_features: int, tp_group: Any = None) -> None:
        super().__init__(in_features, out_features)


def language_config(args: argparse.Namespace) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=args.lm_layers,
        hidden_size=args.lm_hidden,
        num_attention_heads=args.lm_heads,
        ffn_hidden_size=4 * args.lm_hidden,
        hidden_dropout=0.0,  # no dropout: runs that see the same samples give the same losses
        attention_dropout=0.0,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
    )
    config.mrope_section = mrope_section(args.lm_hidden // args.lm_heads)
    return config


def has_transformer_engine() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def packing_problem(args: argparse.Namespace) -> str | None:
    """Why ``--pack-sequences-in-batch`` cannot train here (None: it can, or packing is off): packed micro-batches
    (THD) need TransformerEngine's attention; megatron-core's local ``DotProductAttention`` refuses them."""
    if not args.pack_sequences_in_batch or has_transformer_engine():
        return None
    return ("--pack-sequences-in-batch: packed micro-batches (THD) need TransformerEngine's attention, and transformer_engine is not "
            "installed (megatron-core's local DotProductAttention refuses packed sequences); install it, or train without packing")


def language_layer_spec(args: argparse.Namespace) -> Any:
    """megatron-core's local layer spec; with packing, its attention TransformerEngine's ``TEDotProductAttention`` where
    TransformerEngine is installed (the only attention of megatron-core that takes packed sequences), the rest local."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec()
    if args.pack_sequences_in_batch and has_transformer_engine():
        from megatron.core.extensions.transformer_engine import TEDotProductAttention

        spec.submodules.self_attention.submodules.core_attention = TEDotProductAttention
    return spec


def mimo_model_config(args: argparse.Namespace, vocab_size: int, image_token_id: int, module_to_grid_map: dict | None = None) -> Any:
    """megatron-core's ``MimoModelConfig`` of this recipe's model (``module_to_grid_map``: the
    non-colocated layout's grids)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.mimo import MimoModelConfig
    from megatron.core.models.mimo.submodules.vision import VisionModalitySubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec

    config = language_config(args)
    language = ModuleSpec(module=GPTModel, params={
        "config": config,
        "transformer_layer_spec": language_layer_spec(args),
        "vocab_size": vocab_size,
        "max_sequence_length": args.seq_length,
        "position_embedding_type": "mrope",
        "share_embeddings_and_output_weights": False,
    })
    vision = ModuleSpec(module=VisionModalitySubmodules, submodules={
        "encoders": {ENCODER_KEY: ModuleSpec(module=QwenVisionEncoder, params={"overrides": vision_overrides(args), "seed": args.seed, "config": config})},
        "input_projections": [ModuleSpec(module=InputProjection, params={"in_features": args.lm_hidden, "out_features": args.lm_hidden})],
    })
    options: dict[str, Any] = {} if module_to_grid_map is None else {"module_to_grid_map": module_to_grid_map}
    return MimoModelConfig(language_model_spec=language, modality_submodules_spec={MODALITY: vision},
                           special_token_ids={MODALITY: image_token_id}, **options)


def optimizer_config(args: argparse.Namespace) -> Any:
    from megatron.core.optimizer import OptimizerConfig

    return OptimizerConfig(optimizer="adam", lr=args.lr, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.95, clip_grad=1.0,
                           params_dtype=torch.float32, use_distributed_optimizer=False)


def check_fits(config: PipelineConfig) -> None:
    """Refuses (ConfigError naming ``--seq-length``) data that cannot fit it, before any model is built: every rank
    counts the same rows, so every rank refuses alike."""
    try:
        counts = vlm_sft.row_counts(config, real_tokens=False, runs=False)
    except SampleError as error:  # the processor's own refusal of the first row too long, naming it
        raise ConfigError("--seq-length", str(error)) from None
    problem = seq_length_problem(counts.image_tokens, config.seq_length)
    if problem is not None:
        raise ConfigError("--seq-length", problem)


def join(device: TrainingDevice) -> Any:
    """This process in torch.distributed on ``device``'s backend (torchrun's world, or a world of one) and
    megatron-core's global state; returns the groups the model trains over: a grid of one rank, rank 0 (made on
    every rank of the world: a collective)."""
    from megatron.core import parallel_state

    init_distributed(device)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    return pg_collection(module_grid(tp=1, pp=1, dp=1, rank_offset=0))


def build_model(args: argparse.Namespace, device: TrainingDevice, pgs: Any, vocab_size: int, image_token_id: int,
                totals: dict[str, float]) -> tuple[Any, Any]:
    """(``DistributedDataParallel(MimoModel)``, its megatron optimizer), from seeded weights, on ``device`` over the
    groups ``pgs``; the schedule's settings on the language config (``totals`` gets each iteration's loss tokens)."""
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.enums import ModelType
    from megatron.core.models.mimo import MimoModel
    from megatron.core.optimizer import get_megatron_optimizer

    torch.manual_seed(args.seed)
    tensor_parallel.model_parallel_cuda_manual_seed(args.seed, tp_rank=0, ep_rank=0, etp_rank=0)  # model-parallel RNG states
    config = mimo_model_config(args, vocab_size, image_token_id)
    config.language_model_spec.params["pg_collection"] = pgs
    language = config.language_model_spec.params["config"]
    language.calculate_per_token_loss = True  # the schedule counts loss tokens; finalize_grads divides by them
    model = MimoModel(config).to(device.torch_device())
    model.model_type = ModelType.encoder_or_decoder  # what megatron-core's schedules read (GPTModel has it; MimoModel not)
    ddp = DistributedDataParallel(
        language, DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False), model,
        pg_collection=pgs,
    )
    language.finalize_model_grads_func = finalize_grads(totals)
    language.no_sync_func = ddp.no_sync
    return ddp, get_megatron_optimizer(optimizer_config(args), [ddp], use_gloo_process_groups=False, pg_collection=pgs)


def finalize_grads(totals: dict[str, float]):
    """The schedule's ``finalize_model_grads_func``: gradients reduced, then divided by the iteration's loss tokens
    (megatron-core's per-token loss)."""
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    def finalize(models, num_tokens, pg_collection=None, force_all_reduce=False, **_ignored):
        finalize_model_grads(models, num_tokens=None, pg_collection=pg_collection, force_all_reduce=force_all_reduce)
        totals["tokens"] = max(float(num_tokens), 1.0)
        for model in models:
            model.scale_gradients(1.0 / totals["tokens"])

    return finalize


# --------------------------------------------------------------------------------------------- training


@dataclass
class IterationRecord:
    iteration: int
    loss: float
    model_ms: float  # the rest of the iteration: to the GPU, forward, backward, optimizer step (CUDA-synchronised at its end)
    wait_ms: float  # the training thread blocked waiting for its next micro-batch
    batch_ms: float  # mimo_batch (on the prefetch thread with --prefetch, else on the training thread)
    iteration_ms: float
    grad_norm: float | None
    loss_tokens: int
    images: int
    image_tokens: int
    sample_ids: list[list[int]] = field(default_factory=list)  # per micro-batch
    module_grad_norms: dict[str, float] = field(default_factory=dict)  # per module, before clipping


@dataclass
class Prepared:
    """One micro-batch as the loader yielded it, its ``MimoModel.forward`` keyword arguments, and the
    seconds ``mimo_batch`` took."""

    batch: dict[str, Any]
    kwargs: dict[str, Any]
    seconds: float


def prepared(batch: dict[str, Any], settings: MimoBatchSettings) -> Prepared:
    began = time.perf_counter()
    kwargs = mimo_batch(batch, settings)
    return Prepared(batch, kwargs, time.perf_counter() - began)


class Taken:
    """The schedule's data iterator: each micro-batch taken from ``source`` when its forward starts (the wait
    timed), kept for the record, and handed over as ``MimoModel.forward``'s keyword arguments on ``device``."""

    def __init__(self, source: Iterator[Prepared], device: torch.device) -> None:
        self.source, self.device = source, device
        self.items: list[Prepared] = []
        self.waited = 0.0

    def __iter__(self) -> Taken:
        return self

    def __next__(self) -> dict[str, Any]:
        asked = time.perf_counter()
        item = next(self.source)
        self.waited += time.perf_counter() - asked
        self.items.append(item)
        return to_device(item.kwargs, self.device)


def module_norms(model: Any, pgs: Any) -> dict[str, float]:
    """Each module's gradient norm (the language model and each modality's submodule), before clipping."""
    norms = {name: module_grad_norm(module, pgs) for name, module in model.module.modality_submodules.items()}
    return {**norms, "language": module_grad_norm(model.module.language_model, pgs)}


def iteration_step(model: Any, optimizer: Any, source: Iterator[Prepared], microbatches: int, device: TrainingDevice,
                   prefetching: bool, totals: dict[str, float], pgs: Any) -> tuple[IterationRecord, list[Prepared]]:
    """One iteration through megatron-core's ``forward_backward_no_pipelining``: each micro-batch taken when its
    forward starts, forward and backward of its summed per-token losses, the gradients divided by the
    iteration's loss tokens (the schedule's ``finalize_model_grads_func``), then the optimizer step. Returns the
    record (iteration number 0) and the micro-batches."""
    from megatron.core.pipeline_parallel.schedules import forward_backward_no_pipelining

    device.synchronize()
    began = time.perf_counter()
    model.zero_grad_buffer()
    optimizer.zero_grad()
    taken = Taken(source, device.torch_device())
    losses = forward_backward_no_pipelining(forward_step_func=forward_step, data_iterator=taken, model=model, num_microbatches=microbatches,
                                            seq_length=0, micro_batch_size=0, forward_only=False, pg_collection=pgs)  # sizes: pipelining's
    norms = module_norms(model, pgs)
    updated, grad_norm, _ = optimizer.step()
    tokens = totals["tokens"]
    loss = float(summed_loss(losses)) / tokens
    device.synchronize()
    elapsed = time.perf_counter() - began
    converted = sum(item.seconds for item in taken.items)
    if not updated:
        raise RuntimeError("the optimizer skipped its step (gradient not finite)")
    batches = [item.batch for item in taken.items]
    record = IterationRecord(
        iteration=0, loss=loss, wait_ms=taken.waited * 1e3, batch_ms=converted * 1e3, iteration_ms=elapsed * 1e3,
        model_ms=(elapsed - taken.waited - (0.0 if prefetching else converted)) * 1e3,
        grad_norm=None if grad_norm is None else float(grad_norm), module_grad_norms=norms, loss_tokens=int(tokens),
        images=sum(int(batch["image_grid_thw"].shape[0]) for batch in batches if batch.get("image_grid_thw") is not None),
        image_tokens=sum(int(sum(batch["image_tokens"])) for batch in batches),
        sample_ids=[[int(s) for s in batch["sample_ids"]] for batch in batches],
    )
    return record, taken.items


def train_run(args: argparse.Namespace, reorder: str, pgs: Any, log: Any = print) -> list[IterationRecord]:
    """One run of ``args.iterations`` iterations from fresh seeded weights over a fresh loader, over the groups
    ``pgs`` (:func:`join`)."""
    device = TrainingDevice(args.device)
    config = pipeline_config(args, reorder)
    config.validate(1)
    vlm_sft.prepare(config, log=log)
    check_fits(config)
    processor = vlm_sft.open_processor(config)
    settings = MimoBatchSettings.for_processor(processor, modality=MODALITY, encoder_key=ENCODER_KEY)
    totals: dict[str, float] = {}
    model, optimizer = build_model(args, device, pgs, len(processor.tokenizer), processor.image_token_id, totals)
    log(f"reorder {reorder}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters "
        f"({sum(p.numel() for p in model.module.modality_submodules.parameters()) / 1e6:.1f}M vision)")
    loader = vlm_sft.build(config, RankLayout(dp_rank=0, dp_size=1, grid_size=1))
    # mimo_batch runs where the micro-batch is made: on the loader's read-ahead thread with --prefetch N > 0.
    loader.prepare_with(lambda batch: prepared(batch, settings))
    records: list[IterationRecord] = []
    try:
        for iteration in range(1, args.iterations + 1):
            record, _ = iteration_step(model, optimizer, loader, args.microbatches, device, prefetching=bool(args.prefetch), totals=totals, pgs=pgs)
            record.iteration = iteration
            records.append(record)
            if iteration == 1 or iteration % 10 == 0:
                log(f"reorder {reorder} iteration {iteration}: loss {record.loss:.4f} model {record.model_ms:.1f} ms "
                    f"wait {record.wait_ms:.1f} ms mimo_batch {record.batch_ms:.1f} ms grad norm {record.grad_norm}")
    finally:
        loader.close()
    return records


def summary(records: list[IterationRecord], *, prefetching: bool, skip: int = 1) -> dict[str, Any]:
    """Figures of a run: loss first/last, medians after ``skip`` warm-up iterations, and the shares of the
    iteration (summed over the same iterations) the training thread spent waiting for data and, without
    prefetching, converting it (``data_percent``: both)."""
    steady = records[skip:] if len(records) > skip else records
    total = sum(r.iteration_ms for r in steady)
    waited = sum(r.wait_ms for r in steady)
    converted = 0.0 if prefetching else sum(r.batch_ms for r in steady)
    return {
        "iterations": len(records),
        "loss_first": records[0].loss,
        "loss_last": records[-1].loss,
        "median_model_ms": statistics.median(r.model_ms for r in steady),
        "median_wait_ms": statistics.median(r.wait_ms for r in steady),
        "median_batch_ms": statistics.median(r.batch_ms for r in steady),
        "median_iteration_ms": statistics.median(r.iteration_ms for r in steady),
        "wait_percent": 100.0 * waited / total if total else 0.0,
        "data_percent": 100.0 * (waited + converted) / total if total else 0.0,
        "prefetch": prefetching,
        "warmup_iterations_excluded": len(records) - len(steady),
        "micro_batches": sum(len(r.sample_ids) for r in records),
    }


def environment(device: TrainingDevice) -> dict[str, Any]:
    from importlib.metadata import version

    info: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__}
    for package in ("megatron-core", "transformers", "torchdata"):
        try:
            info[package] = version(package)
        except Exception:  # noqa: BLE001 - a missing distribution is reported as such
            info[package] = None
    info["device"] = device.kind
    if device.is_cuda:
        info["gpu"] = device.name()  # the key the benchmark figures read
    return info


def out_of_memory(name: str, args: argparse.Namespace) -> str:
    """The one line a run that ran out of GPU memory ends with: the settings that cut memory, at their values."""
    return (f"{name}: out of GPU memory at --micro-batch-size {args.micro_batch_size} --seq-length {args.seq_length} "
            f"--lm-layers {args.lm_layers} --lm-hidden {args.lm_hidden} --vision-depth {args.vision_depth} --vision-width {args.vision_width}: "
            f"lower --micro-batch-size (or --seq-length), or the model's sizes")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args, argv)
    except ConfigError as error:
        print(f"megatron_mimo_train: {error}", file=sys.stderr)
        return 2
    except torch.OutOfMemoryError:
        print(out_of_memory("megatron_mimo_train", args), file=sys.stderr)
        return 1


def run(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    require_mrope_and_packing("megatron_mimo_train")  # the release and MimoModel.forward's signature, before anything is built
    device = TrainingDevice(args.device)
    problem = device.problem() or packing_problem(args)
    if problem is not None:
        print(f"megatron_mimo_train: {problem}", file=sys.stderr)
        return 2
    device.fast_matmul()  # fp32 weights, TF32 matrix products on a GPU
    pgs = join(device)
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    for reorder in args.reorder_modes:
        device.reset_peak_memory()
        records = train_run(args, reorder, pgs, log=lambda line: print(line, flush=True))
        figures = {**summary(records, prefetching=bool(args.prefetch)), "peak_memory_gib": device.peak_memory_gib()}
        path = log_dir / f"megatron_mimo_{reorder}.json"
        path.write_text(json.dumps({
            "command": " ".join(["python -m mimo_pipes_recipes.megatron_mimo_train", *(argv if argv is not None else sys.argv[1:])]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "reorder": reorder,
            "settings": {key: value for key, value in vars(args).items() if key != "reorder_modes"},
            "environment": environment(device),
            "summary": figures,
            "iterations": [record.__dict__ for record in records],
        }, indent=1))
        print(f"reorder {reorder}: {json.dumps(figures)} -> {path}", flush=True)
    return 0


if __name__ == "__main__":
    from mimo_pipes.config.flags import flag_names

    with flag_names():  # a setting's error names this program's flag
        raise SystemExit(main())
