"""A job's world of ranks: joining and leaving it, and the few collectives over the job's ranks a job makes
(gathering every rank's records, the agreements of a save, the check that every rank restored one position).

A job's ranks are the first ``topology.world_size`` of the world: all of it under ``run`` and ``train``;
a larger world (a pool of test ranks, say) leaves the rest idle once the groups exist."""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

from mimo_pipes.exchange.lost_peers import collective
from mimo_pipes.exchange.roll_store import sign, sign_roll


def world_backend(world_size: int) -> str:
    """NCCL when every local rank can have a GPU of its own, else Gloo on the CPU."""
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local_ranks else "gloo"


def join_world(rank: int, world_size: int, timeout_s: float, backend: str | None = None) -> str:
    """Join the job's process group (MASTER_ADDR / MASTER_PORT from the environment) and sign the job's roll
    (``roll_store.py``: a peer that stops can then name this rank if it dies); returns the backend.
    ``backend`` None: :func:`world_backend`."""
    backend = backend or world_backend(world_size)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    sign(rank, world_size)
    return backend


def leave_world() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def joined() -> bool:
    """Whether this process is in a process group (a single process outside one is a world of its own)."""
    return dist.is_available() and dist.is_initialized()


def world_rank() -> int:
    return dist.get_rank()


def world_size() -> int:
    return dist.get_world_size()


def current_backend() -> str:
    return str(dist.get_backend())


def job_group(size: int) -> dist.ProcessGroup | None:
    """The group of ranks ``0 .. size-1`` (None: the whole world). Collective over the whole world."""
    if size == dist.get_world_size():
        return None
    return dist.new_group(list(range(size)))


def control_group(size: int) -> dist.ProcessGroup:
    """A Gloo group of ranks ``0 .. size-1`` for the job's own small agreements on the training thread (a
    CPU integer, whatever the world's backend). Collective over the whole world."""
    return dist.new_group(list(range(size)), backend="gloo")


def agreement_group(size: int, timeout_s: float) -> dist.ProcessGroup:
    """A Gloo group of ranks ``0 .. size-1`` reserved for agreeing on rows that fail after the exchange (on the
    processing side's collating thread, beside the trainer and the exchange: a group of its own).
    Collective over the whole world."""
    return dist.new_group(list(range(size)), backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def largest_over_ranks(value: int, group: dist.ProcessGroup, what: str = "the all-reduce of a stop boundary") -> int:
    """The largest ``value`` any rank of ``group`` holds, on every rank of it (one small all-reduce). A peer
    lost meanwhile is a :class:`~mimo_pipes.errors.LostPeerError` naming ``what`` and the rank."""
    tensor = torch.tensor([value], dtype=torch.int64)
    with collective(what):
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return int(tensor.item())


def gather_from_every_rank(value: Any, group: dist.ProcessGroup | None = None, what: str = "an all-gather of every rank's records") -> list[Any]:
    """Every rank's ``value`` (picklable), on every rank of ``group`` (None: the world), by rank. A peer lost
    meanwhile is a :class:`~mimo_pipes.errors.LostPeerError` naming ``what`` (what the gather is for) and the rank."""
    sign_roll()
    gathered: list[Any] = [None] * dist.get_world_size(group)
    with collective(what):
        dist.all_gather_object(gathered, value, group=group)
    return gathered


def barrier(group: dist.ProcessGroup | None = None, what: str = "a barrier") -> None:
    with collective(what):
        dist.barrier(group=group)


def check_same_consumed(consumed_microbatches: int, group: dist.ProcessGroup | None = None) -> None:
    """Every rank of ``group`` (None: the world) restored the same ``consumed_microbatches`` (its loader's,
    ``loader.consumed_microbatches``); else :class:`~mimo_pipes.errors.ConsumedMismatchError` on every rank,
    naming each rank's. One small all-gather: call it on every rank once after a restore, so that
    modules whose states come from different saves never pair the wrong samples."""
    from mimo_pipes.errors import ConsumedMismatchError

    counts = gather_from_every_rank(int(consumed_microbatches), group, what="the check that every rank restored the same micro-batch")
    if len(set(counts)) > 1:
        ranks = [dist.get_global_rank(group, index) if group is not None else index for index in range(len(counts))]
        raise ConsumedMismatchError(dict(zip(ranks, counts)))
