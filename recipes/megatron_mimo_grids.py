"""Recipe: megatron-core's ``MimoModel`` non-colocated, vision and language on their own GPUs.

The model of :mod:`mimo_pipes_recipes.megatron_mimo_train`, laid out through
``MimoModelConfig.module_to_grid_map``: one ``HyperCommGrid`` per module, the vision module on ranks
``[0, d)`` and the language module on ranks ``[d, 2d)`` (``--dp d`` each, tp = cp = pp = 1). Each rank
builds only its module (``MimoModel`` reads its role from the grids), wraps it in megatron-core's
``DistributedDataParallel`` over its grid's data-parallel group, and the two modules share one
``MimoOptimizer`` (``get_mimo_optimizer``). Each rank reads its module's micro-batches from the pipeline
(the graph of :mod:`mimo_pipes_recipes.vlm_sft` for its place in the topology ``images=dp=d`` +
``language=dp=d``): vision rank i and language rank i hold the same samples in the same order, which the
bridge below checks by sample id. Every micro-batch reaches ``MimoModel.forward`` through
:func:`mimo_pipes.megatron.mimo_batch` alone: on vision ranks its ``modality_inputs``, on language ranks
its token fields.

The bridge between the modules is point-to-point, vision rank i to language rank i (equal DP sizes: the
flat ``[image tokens, hidden]`` output goes whole to one peer): the vision rank sends its embeddings, the
language rank hands them to ``MimoModel.set_input_tensor``, and sends their gradient back after its
backward. The loss is per token over the iteration on every language rank (summed over the language DP
group); the gradients of both modules are divided by that count before the optimizer step.

Run with one process per GPU, 2d GPUs (``--reorder off,on`` runs both from the same weights and prints
whether their losses agree)::

    torchrun --nproc-per-node 2 -m mimo_pipes_recipes.megatron_mimo_grids --iterations 20 --reorder off,on
    torchrun --nproc-per-node 4 -m mimo_pipes_recipes.megatron_mimo_grids --dp 2 --iterations 20 --reorder off,on

``--backend gloo`` runs the same on one GPU shared by the processes (a smoke test of the wiring).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from mimo_pipes.config import PipelineConfig
from mimo_pipes.megatron import MimoBatchSettings, mimo_batch, require_mrope_and_packing
from mimo_pipes_recipes import megatron_mimo_train as colocated
from mimo_pipes_recipes import vlm_sft

LANGUAGE = "language"  # megatron-core's fixed key of the language module in module_to_grid_map
GRID_DIMS = ["tp", "cp", "dp", "pp"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The colocated recipe's settings plus ``--dp`` (each module's data-parallel size) and ``--backend``
    (``nccl``; ``gloo`` lets two processes share one GPU for a smoke test, the bridge going through host
    memory)."""
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--dp", type=int, default=1)
    own.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    known, rest = own.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if known.dp < 1:
        own.error(f"--dp: must be >= 1, got {known.dp}")
    args = colocated.parse_args(rest)
    args.dp, args.backend = known.dp, known.backend
    return args


def components(dp: int) -> tuple[str, ...]:
    return (f"{colocated.MODALITY}=tp=1,dp={dp},rank_offset=0", f"{LANGUAGE}=tp=1,pp=1,dp={dp},rank_offset={dp}")


def pipeline_config(args: argparse.Namespace, reorder: str) -> PipelineConfig:
    config = colocated.pipeline_config(args, reorder)
    config.components = components(args.dp)
    return config


def module_grid(dp: int, rank_offset: int, backend: str = "nccl") -> Any:
    """One module's ``HyperCommGrid`` (tp = cp = pp = 1) with the groups DDP and the MIMO optimizer ask for;
    every rank of the world creates every grid's groups (a collective)."""
    from megatron.core.hyper_comm_grid import HyperCommGrid

    grid = HyperCommGrid([1, 1, dp, 1], GRID_DIMS, rank_offset=rank_offset, backend=backend)
    grid.register_view("expert", [1, 1, dp, 1], ["expt_tp", "ep", "expt_dp", "pp"], shared_dims=["pp"])
    for dims in ("tp", "cp", "dp", "pp", ["dp", "cp"], ["tp", "pp"], ["tp", "cp"], ["tp", "cp", "dp", "pp"], ["tp", "dp", "cp"]):
        grid.create_pg(dims)
    for dims in (["expt_tp", "ep", "pp"], "expt_dp", "ep", "expt_tp"):
        grid.create_pg(dims, view="expert")
    return grid


def pg_collection(grid: Any) -> Any:
    from megatron.core.process_groups_config import ProcessGroupCollection

    pgs = ProcessGroupCollection()
    pgs.tp, pgs.cp, pgs.dp, pgs.pp = grid.get_pg("tp"), grid.get_pg("cp"), grid.get_pg("dp"), grid.get_pg("pp")
    pgs.dp_cp = grid.get_pg(["dp", "cp"])
    pgs.mp = grid.get_pg(["tp", "pp"])
    pgs.tp_cp = grid.get_pg(["tp", "cp"])
    pgs.tp_dp_cp = grid.get_pg(["tp", "dp", "cp"])
    pgs.expt_dp = grid.get_pg("expt_dp", view="expert")
    pgs.ep = grid.get_pg("ep", view="expert")
    pgs.expt_tp = grid.get_pg("expt_tp", view="expert")
    pgs.tp_ep_pp = grid.get_pg(["expt_tp", "ep", "pp"], view="expert")
    pgs.intra_dist_opt = grid.get_pg(["tp", "cp", "dp", "pp"])
    return pgs


class GridRank:
    """This rank's module, peer and groups."""

    def __init__(self, dp: int, backend: str = "nccl") -> None:
        self.rank, world = dist.get_rank(), dist.get_world_size()
        if world != 2 * dp:
            raise SystemExit(f"megatron_mimo_grids: --dp {dp} needs {2 * dp} processes, got {world}")
        self.grids = {colocated.MODALITY: module_grid(dp, 0, backend), LANGUAGE: module_grid(dp, dp, backend)}
        self.host_bridge = backend == "gloo"  # Gloo sends host tensors
        self.is_vision = self.rank < dp
        self.module = colocated.MODALITY if self.is_vision else LANGUAGE
        self.peer = self.rank + dp if self.is_vision else self.rank - dp
        self.grid = self.grids[self.module]
        self.pgs = pg_collection(self.grid)


def build_model(args: argparse.Namespace, place: GridRank, vocab_size: int, image_token_id: int) -> tuple[Any, Any, Any]:
    """(``MimoModel`` holding only this rank's module, that module wrapped in DDP, the ``MimoOptimizer``)."""
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.mimo import MimoModel, get_mimo_optimizer

    torch.manual_seed(args.seed)
    tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
    config = colocated.mimo_model_config(args, vocab_size, image_token_id, module_to_grid_map=place.grids)
    language = config.language_model_spec.params["config"]
    language.calculate_per_token_loss = True  # DDP sums gradients; they are divided by the loss tokens below
    language.variable_seq_lengths = True
    model = MimoModel(config).cuda()
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False)
    inner = model.modality_submodules[colocated.MODALITY] if place.is_vision else model.language_model
    wrapped = DistributedDataParallel(language, ddp_config, inner, pg_collection=place.pgs)
    if place.is_vision:
        model.modality_submodules[colocated.MODALITY] = wrapped
    else:
        model.language_model = wrapped
    return model, wrapped, get_mimo_optimizer(model, colocated.optimizer_config(args))


def send_tensor(tensor: torch.Tensor, place: GridRank) -> None:
    dist.send(tensor.detach().cpu() if place.host_bridge else tensor.detach().contiguous(), dst=place.peer)


def recv_tensor(like: torch.Tensor, place: GridRank) -> torch.Tensor:
    buffer = torch.empty_like(like, device="cpu") if place.host_bridge else like
    dist.recv(buffer, src=place.peer)
    return buffer.to(like.device)


def send_object(value: Any, peer: int) -> None:
    dist.send_object_list([value], dst=peer)


def recv_object(peer: int) -> Any:
    box = [None]
    dist.recv_object_list(box, src=peer)
    return box[0]


def vision_microbatch(model: Any, batch: dict[str, Any], settings: MimoBatchSettings, place: GridRank, device: torch.device) -> None:
    """Encode, send the embeddings to the language peer, and backpropagate the gradient it returns."""
    kwargs = colocated.to_device(mimo_batch(batch, settings), device)
    outputs, _ = model(**kwargs)
    embeddings = outputs[colocated.MODALITY]
    send_object((list(batch["sample_ids"]), tuple(embeddings.shape), embeddings.dtype), place.peer)
    if embeddings.numel():
        send_tensor(embeddings, place)
        embeddings.backward(recv_tensor(torch.empty_like(embeddings), place))


def language_microbatch(model: Any, batch: dict[str, Any], settings: MimoBatchSettings, place: GridRank, device: torch.device) -> tuple[torch.Tensor, float]:
    """Receive the peer's embeddings, forward and backward of the summed per-token loss, send the
    embeddings' gradient back; returns the loss sum and the loss tokens."""
    sample_ids, shape, dtype = recv_object(place.peer)
    if sample_ids != list(batch["sample_ids"]):
        raise RuntimeError(f"micro-batch {batch['step']}: the vision peer encoded samples {sample_ids}, this rank holds {batch['sample_ids']}")
    embeddings = torch.empty(shape, dtype=dtype, device=device)
    if embeddings.numel():
        embeddings = recv_tensor(embeddings, place)
    embeddings.requires_grad_(True)
    model.set_input_tensor({colocated.MODALITY: embeddings})
    kwargs = colocated.to_device(mimo_batch(batch, settings), device)
    output, loss_mask = model(**kwargs)
    token_loss = (output.float() * loss_mask.float()).sum()
    token_loss.backward()
    if embeddings.numel():
        send_tensor(embeddings.grad, place)
    return token_loss.detach().double(), float(kwargs["loss_mask"].sum())


def train_run(args: argparse.Namespace, place: GridRank, reorder: str) -> list[dict[str, Any]]:
    from mimo_pipes.cli.rank.setup import set_up_rank

    device = colocated.training_device()
    config = pipeline_config(args, reorder)
    config.validate(dist.get_world_size())
    if place.rank == 0:
        vlm_sft.prepare(config, log=lambda line: print(line, flush=True))
    dist.barrier()
    processor = vlm_sft.open_processor(config)
    settings = MimoBatchSettings.for_processor(processor, modality=colocated.MODALITY, encoder_key=colocated.ENCODER_KEY)
    model, wrapped, optimizer = build_model(args, place, len(processor.tokenizer), processor.image_token_id)
    dp_group = place.pgs.dp
    setup = set_up_rank(config)  # the pipeline's own groups and this rank's layout in its module (collective)
    if setup is None or setup.position.module.name != place.module:
        raise RuntimeError(f"rank {place.rank}: the pipeline's topology places it in another module than the grids ({place.module})")
    loader = vlm_sft.build(config, setup.layout)
    records = []
    try:
        for iteration in range(1, args.iterations + 1):
            torch.cuda.synchronize()
            began = time.perf_counter()
            wrapped.zero_grad_buffer()
            optimizer.zero_grad()
            loss_sum = torch.zeros((), device=device, dtype=torch.float64)
            tokens = 0.0
            for _ in range(args.microbatches):
                batch = next(loader)
                if place.is_vision:
                    vision_microbatch(model, batch, settings, place, device)
                else:
                    token_loss, count = language_microbatch(model, batch, settings, place, device)
                    loss_sum += token_loss
                    tokens += count
            totals = torch.tensor([float(loss_sum), tokens], device=device, dtype=torch.float64)
            if not place.is_vision:
                dist.all_reduce(totals, group=dp_group)
                send_object(totals.tolist(), place.peer)
            else:
                totals = torch.tensor(recv_object(place.peer), device=device, dtype=torch.float64)
            if args.dp > 1 or not place.host_bridge:  # Gloo reduces no CUDA buffers; over one rank it is the identity
                wrapped.finish_grad_sync()
            wrapped.scale_gradients(1.0 / max(float(totals[1]), 1.0))
            updated, grad_norm, _ = optimizer.step()
            torch.cuda.synchronize()
            records.append({"iteration": iteration, "loss": float(totals[0]) / max(float(totals[1]), 1.0), "updated": bool(updated),
                            "grad_norm": grad_norm, "ms": (time.perf_counter() - began) * 1e3})
            if place.rank == 0 and (iteration == 1 or iteration % 10 == 0):
                print(f"reorder {reorder} iteration {iteration}: loss {records[-1]['loss']:.4f} ({records[-1]['ms']:.0f} ms)", flush=True)
    finally:
        loader.close()
        model.destroy()
    return records


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    require_mrope_and_packing("megatron_mimo_grids")  # the release and MimoModel.forward's signature, before anything is built
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    from megatron.core import parallel_state

    # The optimizer's fallbacks read the global model-parallel state; the modules use their grids.
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    torch.backends.cuda.matmul.allow_tf32 = True
    place = GridRank(args.dp, args.backend)
    runs = {}
    for reorder in args.reorder_modes:
        runs[reorder] = train_run(args, place, reorder)
    if place.rank == 0:
        log_dir = Path(args.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / "megatron_mimo_grids.json").write_text(json.dumps({
            "command": " ".join(["torchrun", f"--nproc-per-node {dist.get_world_size()}", "-m mimo_pipes_recipes.megatron_mimo_grids",
                                 *(argv if argv is not None else sys.argv[1:])]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "settings": {k: v for k, v in vars(args).items() if k != "reorder_modes"},
            "environment": colocated.environment(),
            "runs": runs,
        }, indent=1))
        if len(runs) == 2:
            first, second = runs.values()
            largest = max(abs(a["loss"] - b["loss"]) for a, b in zip(first, second))
            print(f"reorder {' vs '.join(runs)}: largest loss difference over {len(first)} iterations {largest:.2e}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
