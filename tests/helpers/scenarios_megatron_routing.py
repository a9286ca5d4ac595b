"""Scenarios on every rank of the Gloo pool: the pipeline laid out from megatron-core ``HyperCommGrid`` objects
(``mimo_pipes.megatron.grids.rank_layout``), what each rank's micro-batches hold for megatron-core's bridge, and
megatron-core's own ``BridgeCommunicator`` moving a tensor built from an encoder rank's micro-batch to its
language peers over Gloo (its CUDA device and NCCL groups redirected to the CPU and Gloo while it runs)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from scenarios_exchange import PAD_VALUES, make_config

from mimo_pipes.megatron.grids import grid_layout, rank_layout
from mimo_pipes.samples.thd import CU_SEQLENS
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline

DATASET_SIZE = 512
GRID_DIMS = ("tp", "cp", "pp", "dp")
HIDDEN = 3


def make_grids(modules: dict[str, dict]) -> dict:
    """``{name: HyperCommGrid}`` from ``{name: {"offset": o, "tp": .., "pp": .., "dp": .., "dims": (...)}}`` (dims
    default tp, cp, pp, dp)."""
    from megatron.core.hyper_comm_grid import HyperCommGrid

    grids = {}
    for name, spec in modules.items():
        dims = list(spec.get("dims", GRID_DIMS))
        grids[name] = HyperCommGrid([spec.get(dim, 1) for dim in dims], dims, rank_offset=spec["offset"])
    return grids


def placeholder_counts(batch: dict) -> list[int]:
    """Each sample's image placeholders, read from the micro-batch's own ``input_ids`` (a packed row cut at
    ``cu_seqlens``)."""
    ids = batch["input_ids"]
    if CU_SEQLENS in batch:
        cuts = [int(c) for c in batch[CU_SEQLENS]]
        return [int((ids[0, start:end] == IMAGE_TOKEN_ID).sum()) for start, end in zip(cuts, cuts[1:])]
    return [int(count) for count in (ids == IMAGE_TOKEN_ID).sum(dim=1)]


def _loader(modules: dict[str, dict], *, micro_batch_size: int, window_size: int, across: bool, pack: bool, seed: int,
            consumed: int = 0):
    grids = make_grids(modules)
    layout = rank_layout(grids, micro_batch_size=micro_batch_size)
    if layout is None:
        return None, None
    components = grid_layout(grids).components
    config = make_config(components, micro_batch_size=micro_batch_size, window_size=window_size, across=across, seed=seed,
                         global_batch_size=micro_batch_size * window_size, seq_length=2048, pack_sequences_in_batch=pack)
    dataset = SyntheticProcessedDataset(DATASET_SIZE, seed=seed)
    loader = pipeline(dataset, config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES,
                      consumed_microbatches=consumed)
    return loader, layout


def _place(modules: dict[str, dict]) -> dict:
    """This rank's place as the pipeline lays it out, and its DP rank as its grid enumerates it."""
    rank = dist.get_rank()
    grids = make_grids(modules)
    position = grid_layout(grids).topology.position(rank)
    grid_dp = next(group.index(rank) for group in grids[position.module.name].get_rank_enum(["dp"]) if rank in group)
    return {"module": position.module.name, "dp_rank": position.dp_rank, "dp_size": position.dp_size,
            "tp_rank": position.tp_rank, "pp_rank": position.pp_rank, "grid_dp_rank": grid_dp}


def _records(loader, steps: int) -> list[dict]:
    out = []
    for _ in range(steps):
        batch = next(loader)
        out.append({"step": int(batch["step"]), "sample_ids": [int(i) for i in batch["sample_ids"]],
                    "counts": placeholder_counts(batch), "rows": int(batch["input_ids"].shape[0]), "packed": CU_SEQLENS in batch,
                    "keys": sorted(key for key in batch if isinstance(batch[key], torch.Tensor))})
    return out


def grid_micro_batches(modules: dict[str, dict], *, steps: int, micro_batch_size: int, window_size: int = 1, across: bool = False,
                       pack: bool = False, seed: int = 3, resume_from: dict[str, dict] | None = None, resume_at: int = 0) -> dict | None:
    """This rank's place and, per micro-batch, its sample ids, each sample's placeholders counted in its own
    ``input_ids``, and the rows of ``input_ids``. With ``resume_from``: the first ``resume_at`` micro-batches are
    consumed on that layout, and ``modules`` continues from ``consumed_microbatches=resume_at`` (an elastic resume
    from a Megatron checkpoint's count)."""
    records_before: list[dict] = []
    if resume_from is not None:
        loader, _ = _loader(resume_from, micro_batch_size=micro_batch_size, window_size=window_size, across=across, pack=pack, seed=seed)
        if loader is not None:
            try:
                records_before = _records(loader, resume_at)
            finally:
                loader.close()
        dist.barrier()
    loader, layout = _loader(modules, micro_batch_size=micro_batch_size, window_size=window_size, across=across, pack=pack, seed=seed,
                             consumed=resume_at if resume_from is not None else 0)
    if loader is None:
        return None
    try:
        records = _records(loader, steps)
    finally:
        loader.close()
    return {**_place(modules), "layout_module": layout.module, "records": records, "before": records_before}


@contextlib.contextmanager
def bridge_on_gloo() -> Iterator[None]:
    """megatron-core's BridgeCommunicator allocates on ``torch.cuda.current_device()`` and makes its groups with
    ``backend='nccl'``: both redirected (the CPU, Gloo) while inside."""
    current_device, new_group, new_subgroups = torch.cuda.current_device, dist.new_group, dist.new_subgroups_by_enumeration

    def gloo_group(*args, **kwargs):
        kwargs["backend"] = "gloo"
        return new_group(*args, **kwargs)

    def gloo_subgroups(*args, **kwargs):
        kwargs["backend"] = "gloo"
        return new_subgroups(*args, **kwargs)

    torch.cuda.current_device, dist.new_group, dist.new_subgroups_by_enumeration = (lambda: "cpu"), gloo_group, gloo_subgroups
    try:
        yield
    finally:
        torch.cuda.current_device, dist.new_group, dist.new_subgroups_by_enumeration = current_device, new_group, new_subgroups


def bridge_delivery(modules: dict[str, dict], *, steps: int, micro_batch_size: int, window_size: int = 1, across: bool = False,
                    seed: int = 3) -> dict | None:
    """megatron-core's own BridgeCommunicator from the encoder grid to the language grid, per micro-batch: each
    encoder leader sends a ``[B, S, H]`` tensor whose sample ``b`` holds its micro-batch's ``b``-th sample id
    and, where megatron-core attaches per-sample sizes (0.19), the flat ``[image tokens, H]`` output whose rows
    hold their sample's id, its sizes attached by ``MimoModel``'s own function from the micro-batch's
    ``input_ids``. Each language rank returns what it received, as sample ids, beside its own micro-batch."""
    from megatron.core.models.mimo.model.base import MimoModel
    from megatron.core.pipeline_parallel.bridge_communicator import BridgeCommunicator

    grids = make_grids(modules)
    encoder = next(name for name in grids if name != "language")
    attach = getattr(MimoModel, "_attach_modality_split_sizes", None)
    loader, layout = _loader(modules, micro_batch_size=micro_batch_size, window_size=window_size, across=across, pack=False, seed=seed)
    with bridge_on_gloo():
        batch_first = BridgeCommunicator(grids[encoder], grids["language"], dim_mapping={"b": 0, "s": 1, "h": 2})
        flat = BridgeCommunicator(grids[encoder], grids["language"], dim_mapping={"b": 0, "s": 1, "h": 2}, tensor_ndim=2) if attach else None
        received: list[dict] = []
        try:
            for _ in range(steps if loader is not None else 0):
                batch = next(loader)
                ids = torch.tensor([int(i) for i in batch["sample_ids"]], dtype=torch.float32)
                if layout.module == encoder:
                    batch_first.send_forward(ids[:, None, None].repeat(1, 2, HIDDEN))
                    if flat is not None:
                        counts = placeholder_counts(batch)
                        rows = torch.repeat_interleave(ids, torch.tensor(counts))[:, None].repeat(1, HIDDEN)
                        stand_in = type("Model", (), {"special_token_ids": {encoder: IMAGE_TOKEN_ID}, "role": type("Role", (), {"mode": None})})
                        attach(stand_in, rows, batch["input_ids"], encoder)
                        flat.send_forward(rows)
                else:
                    got = {"step": int(batch["step"]), "own": [int(i) for i in batch["sample_ids"]], "own_counts": placeholder_counts(batch),
                           "batch_first": [int(v) for v in batch_first.recv_forward()[:, 0, 0]]}
                    if flat is not None:
                        got["flat_rows"] = [int(v) for v in flat.recv_forward()[:, 0]]
                    received.append(got)
        finally:
            if loader is not None:
                loader.close()
            for cached in ("destroy_broadcast_pgs", "destroy_bridge_pgs"):  # 0.19 caches its groups on the class
                if hasattr(BridgeCommunicator, cached):
                    getattr(BridgeCommunicator, cached)()
    if loader is None:
        return None
    return {**_place(modules), "received": received, "split_sizes": attach is not None}
