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

Run with one process per GPU, E + tp * pp * dp GPUs (``--reorder off,on`` runs both from the same weights)::

    torchrun --nproc-per-node 3 -m mimo_pipes_recipes.megatron_mimo_grids --images-dp 1 --language-dp 2 --reorder off,on
    torchrun --nproc-per-node 6 -m mimo_pipes_recipes.megatron_mimo_grids --images-dp 2 --language-dp 4

Needs CUDA GPUs and megatron-core 0.19 or later (``module_to_grid_map``, ``get_mimo_optimizer``, the bridge's
per-sample split sizes); without either it says so in one line and exits with status 2 before building anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from mimo_pipes.config import PipelineConfig
from mimo_pipes.errors import ConfigError
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.megatron import MimoBatchSettings, mimo_batch, require_mrope_and_packing, stage_of
from mimo_pipes.megatron.grids import grid_layout, rank_layout
from mimo_pipes_recipes import megatron_mimo_train as colocated
from mimo_pipes_recipes import vlm_sft

NAME = "megatron_mimo_grids"
LANGUAGE = "language"  # megatron-core's fixed key of the language module in module_to_grid_map
MINIMUM_MEGATRON_CORE = (0, 19)
GRID_DIMS = ["tp", "cp", "pp", "dp"]  # fastest first: the order the pipeline places a module's ranks in
EXPERT_DIMS = ["expt_tp", "ep", "pp", "expt_dp"]  # the view get_mimo_optimizer reads its expert groups from
DENSE_GROUPS = ("tp", "cp", "dp", "pp", ["dp", "cp"], ["tp", "pp"], ["tp", "cp"], ["tp", "cp", "dp", "pp"], ["tp", "dp", "cp"])
EXPERT_GROUPS = (["expt_tp", "ep", "pp"], "expt_dp", "ep", "expt_tp")


# ---------------------------------------------------------------------------------------------- settings


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The colocated recipe's settings plus each module's parallel sizes (and ``--backend``, which must be
    ``nccl``: megatron-core's communicators make NCCL groups)."""
    own = argparse.ArgumentParser(add_help=False)
    for flag, default in (("--images-dp", 1), ("--language-dp", 2), ("--language-tp", 1), ("--language-pp", 1)):
        own.add_argument(flag, type=int, default=default)
    own.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    known, rest = own.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    for name in ("images_dp", "language_dp", "language_tp", "language_pp"):
        if getattr(known, name) < 1:
            own.error(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(known, name)}")
    args = colocated.parse_args(rest)
    for name in ("images_dp", "language_dp", "language_tp", "language_pp", "backend"):
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
    from megatron.core.hyper_comm_grid import HyperCommGrid

    sizes = {colocated.MODALITY: (1, 1, args.images_dp, 0),
             LANGUAGE: (args.language_tp, args.language_pp, args.language_dp, args.images_dp)}
    grids = {}
    for name, (tp, pp, dp, offset) in sizes.items():
        grid = HyperCommGrid([tp, 1, pp, dp], list(GRID_DIMS), rank_offset=offset)
        if create_groups:
            grid.register_view("expert", [tp, 1, pp, dp], list(EXPERT_DIMS), shared_dims=["pp"])
            for dims in DENSE_GROUPS:
                grid.create_pg(dims)
            for dims in EXPERT_GROUPS:
                grid.create_pg(dims, view="expert")
        grids[name] = grid
    return grids


def pipeline_config(args: argparse.Namespace, reorder: str, components: Sequence[str]) -> PipelineConfig:
    config = colocated.pipeline_config(args, reorder)
    config.components = tuple(components)
    return config


# ------------------------------------------------------------------------------------------------ model


def pg_collection(grid: Any) -> Any:
    """One module's process groups, from its grid (the groups ``module_grids`` made)."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    pgs = ProcessGroupCollection()
    pgs.tp, pgs.cp, pgs.dp, pgs.pp = grid.get_pg("tp"), grid.get_pg("cp"), grid.get_pg("dp"), grid.get_pg("pp")
    pgs.dp_cp, pgs.mp, pgs.tp_cp = grid.get_pg(["dp", "cp"]), grid.get_pg(["tp", "pp"]), grid.get_pg(["tp", "cp"])
    pgs.tp_dp_cp = grid.get_pg(["tp", "dp", "cp"])
    pgs.intra_dist_opt = grid.get_pg(["tp", "cp", "dp", "pp"])
    pgs.expt_dp, pgs.ep = grid.get_pg("expt_dp", view="expert"), grid.get_pg("ep", view="expert")
    pgs.expt_tp, pgs.tp_ep_pp = grid.get_pg("expt_tp", view="expert"), grid.get_pg(["expt_tp", "ep", "pp"], view="expert")
    pgs.embd = pgs.pos_embd = None  # input and output embeddings are not shared (share_embeddings_and_output_weights False)
    return pgs


class Place:
    """This rank's module, its groups and its language pipeline stage."""

    def __init__(self, grids: dict[str, Any]) -> None:
        self.rank = dist.get_rank()
        self.grids = grids
        self.module = next(name for name, grid in grids.items() if grid.is_current_rank_in_grid())
        self.is_language = self.module == LANGUAGE
        self.pgs = pg_collection(grids[self.module])
        self.stage = stage_of(self.pgs.pp.rank(), self.pgs.pp.size())
        self.counts_tokens = self.is_language and self.stage in ("only", "last") and self.pgs.tp.rank() == 0


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
    model = MimoModel(config).cuda()
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
        tokens = torch.zeros(1, dtype=torch.float64, device="cuda")
        if place.counts_tokens and num_tokens is not None:
            tokens += num_tokens.double().sum()
            dist.all_reduce(tokens, group=place.pgs.dp_cp)
            if place.pgs.dp.rank() != 0:
                tokens.zero_()
        dist.all_reduce(tokens, op=dist.ReduceOp.MAX)  # every rank, both modules: the same count
        totals["tokens"] = float(tokens)
        module = model.language_model if place.is_language else model.modality_submodules[colocated.MODALITY]
        finalize_model_grads([module], num_tokens=None, pg_collection=place.pgs, force_all_reduce=force_all_reduce)
        module.scale_gradients(1.0 / max(totals["tokens"], 1.0))

    return finalize


# --------------------------------------------------------------------------------------------- training


def loss_func(loss_mask: torch.Tensor, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Summed per-token loss, its token count, and both for the log (megatron-core's per-token-loss contract)."""
    token_loss = (output.float() * loss_mask.float()).sum()
    tokens = loss_mask.float().sum().to(torch.int)
    return token_loss, tokens, {"lm loss": torch.stack((token_loss.detach(), tokens.detach().float()))}


def forward_step(data_iterator: Iterator[dict[str, Any]], model: Any) -> tuple[Any, Any]:
    output, loss_mask = model(**next(data_iterator))
    return output, partial(loss_func, loss_mask)


def forward_inputs(loader: GraphLoader, settings: MimoBatchSettings) -> Iterator[dict[str, Any]]:
    """Each micro-batch as ``MimoModel.forward``'s keyword arguments for this rank's stage, on its GPU: made on the
    loader's read-ahead thread (``--prefetch``, the pipeline's read_ahead), only copied to the GPU here."""
    device = colocated.training_device()
    loader.prepare_with(lambda batch: mimo_batch(batch, settings))
    for kwargs in loader:
        yield colocated.to_device(kwargs, device)


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


def iteration(args: argparse.Namespace, model: Any, optimizer: Any, inputs: Iterator[dict], comm: Any, groups: Any,
              totals: dict[str, float]) -> dict[str, Any]:
    """One iteration: ``--microbatches`` micro-batches through megatron-core's 1F1B schedule, then the step."""
    from megatron.core.pipeline_parallel.schedules import forward_backward_pipelining_without_interleaving

    torch.cuda.synchronize()
    began = time.perf_counter()
    model.zero_grad_buffer()
    optimizer.zero_grad()
    losses = forward_backward_pipelining_without_interleaving(
        forward_step_func=forward_step, data_iterator=inputs, model=[model], num_microbatches=args.microbatches,
        seq_length=args.seq_length, micro_batch_size=args.micro_batch_size // args.language_dp, forward_only=False,
        p2p_communicator=comm, pg_collection=groups,
    )
    updated, grad_norm, _ = optimizer.step()
    torch.cuda.synchronize()
    loss_sum = torch.zeros(1, dtype=torch.float64, device="cuda")
    for item in losses or []:
        loss_sum += item["lm loss"][0].double()
    return {"loss_sum": loss_sum, "tokens": totals.get("tokens", 0.0), "updated": bool(updated),
            "grad_norm": None if grad_norm is None else float(grad_norm), "ms": (time.perf_counter() - began) * 1e3}


def everywhere(loss_sum: torch.Tensor, place: Place) -> torch.Tensor:
    """The iteration's summed loss (the language model's last stage, over its DP replicas) on every rank."""
    if place.counts_tokens:
        dist.all_reduce(loss_sum, group=place.pgs.dp_cp)
    if not place.counts_tokens or place.pgs.dp.rank() != 0:
        loss_sum.zero_()
    dist.all_reduce(loss_sum)
    return loss_sum


def train_run(args: argparse.Namespace, place: Place, reorder: str) -> list[dict[str, Any]]:
    components = grid_layout(place.grids, micro_batch_size=args.micro_batch_size).components
    config = pipeline_config(args, reorder, components)
    config.validate(dist.get_world_size())
    if place.rank == 0:
        vlm_sft.prepare(config, log=lambda line: print(line, flush=True))
    dist.barrier()
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
        inputs = forward_inputs(loader, settings)
        for number in range(1, args.iterations + 1):
            record = iteration(args, model, optimizer, inputs, comm, groups, totals)
            loss = float(everywhere(record.pop("loss_sum"), place)) / max(record["tokens"], 1.0)
            records.append({"iteration": number, "loss": loss, **record})
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
        "environment": colocated.environment(),
        "runs": runs,
    }, indent=1))


def refusal(args: argparse.Namespace) -> str | None:
    """Why this machine or these settings cannot run the recipe, checked before anything is built (None: they
    can): megatron-core's version, CUDA, the processes (and a GPU for each), and the layout the grids make for the pipeline."""
    problem = megatron_core_problem()
    if problem is not None:
        return problem
    if not torch.cuda.is_available():
        return "needs CUDA GPUs (megatron-core's bridge and pipeline communicators allocate on CUDA and talk over NCCL); none found"
    if args.backend != "nccl":
        return f"--backend {args.backend}: megatron-core's BridgeCommunicator makes its groups with NCCL; this recipe runs on NCCL only"
    problem = world_problem(args, int(os.environ.get("WORLD_SIZE", 1)))
    if problem is not None:
        return problem
    try:  # the grids' attributes alone: WORLD_SIZE is set, no process group is made
        grid_layout(module_grids(args, create_groups=False), micro_batch_size=args.micro_batch_size)
    except ConfigError as error:
        return str(error)
    return gpus_problem(int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1))), torch.cuda.device_count())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    problem = refusal(args)  # the release first, then CUDA, the processes and the grids: before anything is built
    if problem is not None:
        print(f"{NAME}: {problem}", file=sys.stderr)
        return 2
    require_mrope_and_packing(NAME)  # MimoModel.forward's signature, by the one rule
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    rank = int(os.environ.get("RANK", 0))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dist.init_process_group("nccl")
    from megatron.core import parallel_state

    # The optimizer's fallbacks read the global model-parallel state; the modules use their grids' groups.
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    torch.backends.cuda.matmul.allow_tf32 = True
    place = Place(module_grids(args))
    runs = {reorder: train_run(args, place, reorder) for reorder in args.reorder_modes}
    if place.rank == 0:
        write_log(args, argv, runs)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from mimo_pipes.config.flags import flag_names

    with flag_names():  # a setting's error names this program's flag
        raise SystemExit(main())
