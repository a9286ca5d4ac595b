"""Recipe: megatron-core's ``MimoModel`` non-colocated, trained through megatron-core's own machinery.

The model of :mod:`mimo_pipes_recipes.megatron_mimo_train`, laid out through ``MimoModelConfig.module_to_grid_map``:
one ``HyperCommGrid`` per module, the vision module on ranks ``[0, E)`` (``--images-dp E``, tp = pp = 1) and the
language model on the ranks after them (``--language-tp``, ``--language-pp``, ``--language-dp``; the language
DP size a multiple of the vision one: megatron-core's bridge fans out, never in). The same grids lay the pipeline
out (:func:`mimo_pipes.megatron.grids.rank_layout`): each rank reads its module's micro-batches, and each vision
rank's micro-batch is its language peers' concatenated in order, holding ``input_ids`` so that ``MimoModel``
splits its output per sample and the bridge hands each language replica the rows of its own samples
(:mod:`mimo_pipes.megatron.routing`).

Per module: megatron-core's ``DistributedDataParallel`` over the grid's groups; one ``MimoOptimizer``
(``get_mimo_optimizer``) for both. Activations and gradients cross the modules through megatron-core's
``MultiModulePipelineCommunicator`` (a ``BridgeCommunicator`` on the vision -> language edge, point-to-point
inside the language pipeline) under its 1F1B schedule (``forward_backward_pipelining_without_interleaving``).
The loss is per token over the iteration: the loss tokens of the language model's last stage, summed over its
DP replicas, divide both modules' gradients. Every micro-batch reaches ``MimoModel.forward`` through
:func:`mimo_pipes.megatron.mimo_batch` alone, with the keys its pipeline stage takes.

With ``--save DIR --save-interval N`` every N-th iteration is saved into Megatron's folder layout (``DIR/iter_{k:07d}/``:
each module's model and optimizer part, :mod:`mimo_pipes.megatron.model_state`, and the pipeline's state,
:mod:`mimo_pipes.megatron.checkpoint`), committed by Megatron's tracker file once every rank has written its part;
``--load DIR`` resumes from the iteration the tracker names, on any data-parallel sizes of the same tp and pp, and
trains on to ``--iterations``.

Run with one process per GPU, E + tp * pp * dp GPUs (``--reorder off,on`` runs both from the same weights)::

    torchrun --nproc-per-node 3 -m mimo_pipes_recipes.megatron_mimo_grids --images-dp 1 --language-dp 2 --reorder off,on
    torchrun --nproc-per-node 6 -m mimo_pipes_recipes.megatron_mimo_grids --images-dp 2 --language-dp 4

Needs megatron-core 0.19 or later (``module_to_grid_map``, ``get_mimo_optimizer``, the bridge's per-sample split
sizes) and, by default, CUDA GPUs (``--device cuda``, NCCL); ``--device cpu`` trains on CPU processes over Gloo,
slowly: the debugging and CI path (megatron-core itself still assumes CUDA in places, which the project's tests
stand in for). Without what it needs it says so in one line and exits with status 2 before building anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from mimo_pipes.config import PipelineConfig
from mimo_pipes.errors import ConfigError
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.megatron import MimoBatchSettings, mimo_batch, require_mrope_and_packing, stage_of
from mimo_pipes.megatron.checkpoint import commit_iteration, latest_iteration, load_pipeline_state, save_pipeline_state
from mimo_pipes.megatron.device import TrainingDevice, init_distributed, to_device
from mimo_pipes.megatron.grids import grid_layout, rank_layout
from mimo_pipes.megatron.groups import module_grid, pg_collection
from mimo_pipes.megatron.model_state import load_model_state, save_model_state
from mimo_pipes.megatron.step import forward_step, module_grad_norm, summed_loss
from mimo_pipes_recipes import megatron_mimo_train as colocated
from mimo_pipes_recipes import vlm_sft

NAME = "megatron_mimo_grids"
LANGUAGE = "language"  # megatron-core's fixed key of the language module in module_to_grid_map
MINIMUM_MEGATRON_CORE = (0, 19)


# ---------------------------------------------------------------------------------------------- settings


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The colocated recipe's settings (``--device`` among them) plus each module's parallel sizes."""
    own = argparse.ArgumentParser(add_help=False)
    for flag, default in (("--images-dp", 1), ("--language-dp", 2), ("--language-tp", 1), ("--language-pp", 1), ("--save-interval", 1)):
        own.add_argument(flag, type=int, default=default)
    own.add_argument("--save", default=None, help="Megatron's checkpoint folder to save into (every --save-interval iterations)")
    own.add_argument("--load", default=None, help="Megatron's checkpoint folder to resume from (its latest committed iteration)")
    known, rest = own.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    for name in ("images_dp", "language_dp", "language_tp", "language_pp", "save_interval"):
        if getattr(known, name) < 1:
            own.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(known, name)}")
    args = colocated.parse_args(rest)
    if (known.save or known.load) and len(args.reorder_modes) > 1:
        own.error("--save / --load: one --reorder mode per run (each mode trains from the start)")
    for name in ("images_dp", "language_dp", "language_tp", "language_pp", "save_interval", "save", "load"):
        setattr(args, name, getattr(known, name))
    return args


def megatron_core_problem(installed: str | None = None) -> str | None:
    """Why the installed megatron-core cannot run this recipe (None: it can): the version rule of
    :mod:`mimo_pipes.megatron.forward`, with this recipe's floor (the communicator's per-sample split sizes)."""
    from mimo_pipes.megatron.forward import installed_version, release

    installed = installed_version() if installed is None else installed
    if installed is None:
        return "needs megatron-core 0.19 or later; it is not installed"
    try:
        major_minor = release(installed)
    except ValueError:
        return f"cannot read the megatron-core version {installed!r}; needs 0.19 or later"
    if major_minor < MINIMUM_MEGATRON_CORE:
        return (f"needs megatron-core 0.19 or later (MimoModel's module_to_grid_map, get_mimo_optimizer, the bridge's "
                f"per-sample split sizes); installed {installed} (0.18 and later need Python >= 3.12)")
    return None


def world_problem(args: argparse.Namespace, world_size: int) -> str | None:
    needed = args.images_dp + args.language_tp * args.language_pp * args.language_dp
    if world_size != needed:
        return (f"--images-dp {args.images_dp} + --language-tp {args.language_tp} x --language-pp {args.language_pp} x "
                f"--language-dp {args.language_dp} needs {needed} processes, got {world_size}")
    return None


def gpus_problem(processes_here: int, gpus: int) -> str | None:
    """NCCL takes one GPU per rank: a node that starts more processes than it has GPUs is refused (NCCL would stop
    every rank at the first collective with "Duplicate GPU detected")."""
    if processes_here > gpus:
        return (f"{processes_here} processes on this node but {gpus} GPU{'s' * (gpus != 1)}: NCCL takes one GPU per rank; "
                f"start at most {gpus} per node (torchrun --nproc-per-node), on more nodes if the layout needs more")
    return None


def module_grids(args: argparse.Namespace, *, create_groups: bool = True) -> dict[str, Any]:
    """``module_to_grid_map``: the vision grid on the first ranks, the language grid after it. With
    ``create_groups`` every group DDP, the optimizer and the communicator ask for is made (a collective)."""
    return {colocated.MODALITY: module_grid(tp=1, pp=1, dp=args.images_dp, rank_offset=0, create_groups=create_groups),
            LANGUAGE: module_grid(tp=args.language_tp, pp=args.language_pp, dp=args.language_dp, rank_offset=args.images_dp,
                                  create_groups=create_groups)}


def pipeline_config(args: argparse.Namespace, reorder: str, components: Sequence[str]) -> PipelineConfig:
    config = colocated.pipeline_config(args, reorder)
    config.components = tuple(components)
    return config


# ------------------------------------------------------------------------------------------------ model


class Place:
    """This rank's module, its groups and its language pipeline stage."""

    def __init__(self, grids: dict[str, Any], device: TrainingDevice) -> None:
        self.rank = dist.get_rank()
        self.device = device
        self.grids = grids
        self.module = next(name for name, grid in grids.items() if grid.is_current_rank_in_grid())
        self.is_language = self.module == LANGUAGE
        self.pgs = pg_collection(grids[self.module])
        self.stage = stage_of(self.pgs.pp.rank(), self.pgs.pp.size())
        self.counts_tokens = self.is_language and self.stage in ("only", "last") and self.pgs.tp.rank() == 0

    def module_of(self, model: Any) -> Any:
        """This rank's module of ``model``, in its DDP."""
        return model.language_model if self.is_language else model.modality_submodules[colocated.MODALITY]

    def zeros(self, size: int = 1) -> torch.Tensor:
        """float64 zeros where this rank's collectives take them (its GPU; the CPU over Gloo)."""
        return torch.zeros(size, dtype=torch.float64, device=self.device.torch_device())


def build_model(args: argparse.Namespace, place: Place, vocab_size: int, image_token_id: int) -> tuple[Any, Any, Any]:
    """(``MimoModel`` holding this rank's module, that module in megatron-core's DDP, the ``MimoOptimizer``)."""
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.mimo import MimoModel, get_mimo_optimizer

    torch.manual_seed(args.seed)
    tensor_parallel.model_parallel_cuda_manual_seed(args.seed, tp_rank=place.pgs.tp.rank())
    config = colocated.mimo_model_config(args, vocab_size, image_token_id, module_to_grid_map=place.grids)
    params = config.language_model_spec.params
    language = params["config"]
    language.tensor_model_parallel_size, language.pipeline_model_parallel_size = args.language_tp, args.language_pp
    language.calculate_per_token_loss = True  # the schedule counts loss tokens; the gradients are divided below
    language.variable_seq_lengths = True  # megatron-core's multi-module schedule requires it
    language.pipeline_dtype = torch.float32
    if place.is_language:
        params.update(pg_collection=place.pgs, pre_process=place.stage in ("only", "first"),
                      post_process=place.stage in ("only", "last"))
    model = MimoModel(config).to(place.device.torch_device())
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False)
    if place.is_language:
        model.language_model = DistributedDataParallel(language, ddp_config, model.language_model, pg_collection=place.pgs)
    else:
        inner = model.modality_submodules[colocated.MODALITY]
        model.modality_submodules[colocated.MODALITY] = DistributedDataParallel(language, ddp_config, inner, pg_collection=place.pgs)
    model.config = language  # the schedule reads its settings and callbacks here
    return model, language, get_mimo_optimizer(model, colocated.optimizer_config(args))


def finalize_grads(place: Place, model: Any, totals: dict[str, float]):
    """The schedule's ``finalize_model_grads_func``: the loss tokens of the iteration (the language model's last
    stage, summed over its DP replicas) reach every rank; each module's DDP reduces its gradients over its DP
    group, divided by those tokens."""
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    def finalize(_models, num_tokens, pg_collection=None, force_all_reduce=False, **_ignored):
        tokens = place.zeros()
        if place.counts_tokens and num_tokens is not None:
            tokens += num_tokens.double().sum()
            dist.all_reduce(tokens, group=place.pgs.dp_cp)
            if place.pgs.dp.rank() != 0:
                tokens.zero_()
        dist.all_reduce(tokens, op=dist.ReduceOp.MAX)  # every rank, both modules: the same count
        totals["tokens"] = float(tokens)
        module = place.module_of(model)
        finalize_model_grads([module], num_tokens=None, pg_collection=place.pgs, force_all_reduce=force_all_reduce)
        module.scale_gradients(1.0 / max(totals["tokens"], 1.0))

    return finalize


# --------------------------------------------------------------------------------------------- training


def forward_inputs(loader: GraphLoader, settings: MimoBatchSettings, device: TrainingDevice) -> Iterator[dict[str, Any]]:
    """Each micro-batch as ``MimoModel.forward``'s keyword arguments for this rank's stage, on its device: made on the
    loader's read-ahead thread (``--prefetch``, the pipeline's read_ahead), only copied to the device here."""
    device = device.torch_device()
    loader.prepare_with(lambda batch: mimo_batch(batch, settings))
    for kwargs in loader:
        yield to_device(kwargs, device)


def communicator(model: Any, place: Place) -> tuple[Any, Any]:
    """megatron-core's multi-module communicator (vision -> language; the vision output is flat, 2-D) and the
    schedule's process groups for this rank."""
    from megatron.core.pipeline_parallel.multimodule_communicator import MultiModulePipelineCommunicator
    from megatron.core.process_groups_config import MultiModuleProcessGroupCollection

    links = {colocated.MODALITY: [LANGUAGE], LANGUAGE: []}
    comm = MultiModulePipelineCommunicator(place.grids, links, model.config, dim_mapping={"s": 0, "b": 1, "h": 2},
                                           module_output_ndim={colocated.MODALITY: 2})
    groups = MultiModuleProcessGroupCollection(module_pgs={place.module: place.pgs},
                                               language_model_module_name=LANGUAGE if place.is_language else None)
    return comm, groups


def module_norms(model: Any, place: Place) -> dict[str, float]:
    """Each module's gradient norm, before clipping, on every rank (each module's ranks give their own)."""
    names = [colocated.MODALITY, LANGUAGE]
    norms = place.zeros(len(names))
    norms[names.index(place.module)] = module_grad_norm(place.module_of(model), place.pgs)
    dist.all_reduce(norms, op=dist.ReduceOp.MAX)
    return {name: float(norm) for name, norm in zip(names, norms.tolist())}


def iteration(args: argparse.Namespace, model: Any, optimizer: Any, inputs: Iterator[dict], comm: Any, groups: Any,
              place: Place, totals: dict[str, float]) -> dict[str, Any]:
    """One iteration: ``--microbatches`` micro-batches through megatron-core's 1F1B schedule, then the step."""
    from megatron.core.pipeline_parallel.schedules import forward_backward_pipelining_without_interleaving

    place.device.synchronize()
    began = time.perf_counter()
    model.zero_grad_buffer()
    optimizer.zero_grad()
    losses = forward_backward_pipelining_without_interleaving(
        forward_step_func=forward_step, data_iterator=inputs, model=[model], num_microbatches=args.microbatches,
        seq_length=args.seq_length, micro_batch_size=args.micro_batch_size // args.language_dp, forward_only=False,
        p2p_communicator=comm, pg_collection=groups,
    )
    norms = module_norms(model, place)
    updated, grad_norm, _ = optimizer.step()
    place.device.synchronize()
    return {"loss_sum": summed_loss(losses).to(place.device.torch_device()), "tokens": totals.get("tokens", 0.0), "updated": bool(updated),
            "grad_norm": None if grad_norm is None else float(grad_norm), "module_grad_norms": norms, "ms": (time.perf_counter() - began) * 1e3}


def everywhere(loss_sum: torch.Tensor, place: Place) -> torch.Tensor:
    """The iteration's summed loss (the language model's last stage, over its DP replicas) on every rank."""
    if place.counts_tokens:
        dist.all_reduce(loss_sum, group=place.pgs.dp_cp)
    if not place.counts_tokens or place.pgs.dp.rank() != 0:
        loss_sum.zero_()
    dist.all_reduce(loss_sum)
    return loss_sum


def resume(args: argparse.Namespace, place: Place, model: Any, optimizer: Any, loader: GraphLoader, config: PipelineConfig) -> int:
    """With ``--load``: the model, optimizer and loader as the latest committed iteration left them; returns that
    iteration (0: nothing to resume)."""
    iteration = latest_iteration(args.load) if args.load else None
    if iteration is None:
        return 0
    load_model_state(args.load, iteration, module=place.module, pgs=place.pgs, model=place.module_of(model).module, optimizer=optimizer)
    loader.load_state_dict(load_pipeline_state(args.load, iteration, config=config, consumed_microbatches=iteration * args.microbatches))
    return iteration


def save(args: argparse.Namespace, place: Place, iteration: int, model: Any, optimizer: Any, loader: GraphLoader, config: PipelineConfig) -> None:
    """Iteration ``iteration`` into ``--save``: each module's part, then the pipeline's state (collective: past it
    every rank has written), then Megatron's tracker names it."""
    save_model_state(args.save, iteration, module=place.module, pgs=place.pgs, model=place.module_of(model).module, optimizer=optimizer)
    save_pipeline_state(args.save, iteration, loader.state_dict(), config=config, consumed_microbatches=iteration * args.microbatches)
    if place.rank == 0:
        commit_iteration(args.save, iteration)


def train_run(args: argparse.Namespace, place: Place, reorder: str) -> list[dict[str, Any]]:
    components = grid_layout(place.grids, micro_batch_size=args.micro_batch_size).components
    config = pipeline_config(args, reorder, components)
    config.validate(dist.get_world_size())
    if place.rank == 0:
        vlm_sft.prepare(config, log=lambda line: print(line, flush=True))
    dist.barrier()
    colocated.check_fits(config)
    processor = vlm_sft.open_processor(config)
    # An encoder rank's MimoModel reads input_ids (to split its output per sample) and the encoder inputs, never positions.
    settings = MimoBatchSettings.for_processor(processor, modality=colocated.MODALITY, encoder_key=colocated.ENCODER_KEY, stage=place.stage,
                                               mrope=place.is_language)
    model, language, optimizer = build_model(args, place, len(processor.tokenizer), processor.image_token_id)
    totals: dict[str, float] = {}
    language.finalize_model_grads_func = finalize_grads(place, model, totals)
    language.no_sync_func = model.no_sync
    comm, groups = communicator(model, place)
    loader = vlm_sft.build(config, rank_layout(place.grids, micro_batch_size=args.micro_batch_size))
    records = []
    try:
        done = resume(args, place, model, optimizer, loader, config)
        inputs = forward_inputs(loader, settings, place.device)
        for number in range(done + 1, args.iterations + 1):
            record = iteration(args, model, optimizer, inputs, comm, groups, place, totals)
            loss = float(everywhere(record.pop("loss_sum"), place)) / max(record["tokens"], 1.0)
            records.append({"iteration": number, "loss": loss, **record})
            if args.save and number % args.save_interval == 0:
                save(args, place, number, model, optimizer, loader, config)
            if place.rank == 0 and (number == 1 or number % 10 == 0):
                print(f"reorder {reorder} iteration {number}: loss {loss:.4f} ({record['ms']:.0f} ms)", flush=True)
    finally:
        loader.close()
        model.destroy()
    return records


def write_log(args: argparse.Namespace, argv: Sequence[str] | None, runs: dict[str, list]) -> None:
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / f"{NAME}.json").write_text(json.dumps({
        "command": " ".join(["torchrun", f"--nproc-per-node {dist.get_world_size()}", f"-m mimo_pipes_recipes.{NAME}",
                             *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": {key: value for key, value in vars(args).items() if key != "reorder_modes"},
        "environment": colocated.environment(TrainingDevice(args.device)),
        "runs": runs,
    }, indent=1))


def refusal(args: argparse.Namespace) -> str | None:
    """Why this machine or these settings cannot run the recipe, checked before anything is built (None: they
    can): megatron-core's version, the device, the processes (and a GPU for each on CUDA), and the layout the grids
    make for the pipeline."""
    problem = megatron_core_problem()
    if problem is not None:
        return problem
    device = TrainingDevice(args.device)
    problem = device.problem() or colocated.packing_problem(args)
    if problem is not None:
        return problem
    problem = world_problem(args, int(os.environ.get("WORLD_SIZE", 1)))
    if problem is not None:
        return problem
    try:  # the grids' attributes alone: WORLD_SIZE is set, no process group is made
        grid_layout(module_grids(args, create_groups=False), micro_batch_size=args.micro_batch_size)
    except ConfigError as error:
        return str(error)
    if not device.is_cuda:
        return None
    return gpus_problem(int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1))), device.gpus())


def join(args: argparse.Namespace) -> Place:
    """This process in the job's process group on ``--device``, megatron-core's global state and the grids' groups."""
    from megatron.core import parallel_state

    device = TrainingDevice(args.device)
    init_distributed(device)
    # The optimizer's fallbacks read the global model-parallel state; the modules use their grids' groups.
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    device.fast_matmul()
    return Place(module_grids(args), device)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    problem = refusal(args)  # the release first, then the device, the processes and the grids: before anything is built
    if problem is not None:
        print(f"{NAME}: {problem}", file=sys.stderr)
        return 2
    require_mrope_and_packing(NAME)  # MimoModel.forward's signature, by the one rule
    place = join(args)
    try:
        runs = {reorder: train_run(args, place, reorder) for reorder in args.reorder_modes}
    except ConfigError as error:
        print(f"{NAME}: {error}", file=sys.stderr)
        return 2
    except torch.OutOfMemoryError:
        print(f"rank {place.rank}: {colocated.out_of_memory(NAME, args)}", file=sys.stderr)
        return 1
    if place.rank == 0:
        write_log(args, argv, runs)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from mimo_pipes.config.flags import flag_names

    with flag_names():  # a setting's error names this program's flag
        raise SystemExit(main())
