"""The exchange's transport, derived from ``--exchange-transport``, the world's backend and the overlap."""

from __future__ import annotations

import logging
import os

from mimo_pipes.config.counts import as_count
from mimo_pipes.config.flags import flag
from mimo_pipes.errors import ConfigError


def resolve_exchange_transport(requested: str, world_backend: str, overlap: bool, device_max_connections: str | None,
                               warn: bool = True) -> str:
    """The backend of the exchange group: ``gloo`` (CPU bytes) or ``nccl`` (bytes staged through the GPU).

    ``overlap``: the exchange runs off the training thread (overlapped, or on the loader's read-ahead thread).
    ``auto`` takes NCCL only for an exchange on the training thread of an NCCL run; an overlapped exchange
    goes over Gloo, which cannot contend with the trainer's NCCL kernels (an overlapped NCCL exchange beside
    a trainer's all-reduce hung once on two H200s, before a fix; see docs/benchmarks.md). ``warn`` False:
    the risky choice is not logged (a job says it once, before its ranks start).
    """
    single_queue = device_max_connections is not None and device_max_connections.strip() == "1"
    if requested == "auto":
        return "nccl" if world_backend == "nccl" and not overlap else "gloo"
    if requested == "nccl" and world_backend != "nccl":
        raise ConfigError(flag("exchange_transport"), "nccl needs one GPU per rank; this run uses gloo")
    if requested == "nccl" and overlap and single_queue:
        raise ConfigError(
            flag("exchange_transport"),
            "nccl with overlap is refused under CUDA_DEVICE_MAX_CONNECTIONS=1: with one hardware queue the "
            "prefetch thread's all_to_all and the trainer's gradient all-reduce run in issue order, which differs "
            f"across ranks, and training deadlocks. Use {flag('exchange_transport')} gloo (overlap kept, CPU bytes) or "
            f"{flag('overlap_intra_microbatch_reorder')}{'' if flag('exchange_transport').startswith('--') else ' False'} "
            f"with {flag('read_ahead')} 0 (both collectives on the training thread)",
        )
    if requested == "nccl" and overlap and warn:
        logging.getLogger(__name__).warning(
            f"{flag('exchange_transport')} nccl with overlap: NCCL kernels of the prefetch thread and of the trainer can "
            "be ordered differently on different ranks (a run of this kind hung once, before a fix). "
            f"{flag('exchange_transport')} gloo keeps the overlap without that risk."
        )
    return requested


def check_read_ahead(read_ahead: object, *, exchange_on_gpu: bool, exchanges: bool, name: str | None = None,
                     device_max_connections: str | None = None) -> int:
    """``read_ahead`` as a count (ConfigError naming ``name``), refused where its thread would issue NCCL
    collectives that can deadlock: an exchange over an NCCL group (``exchange_on_gpu``) that ``exchanges`` (reordering
    over DP > 1) runs on the read-ahead thread, and under ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (one hardware queue) its
    all_to_all and the trainer's all-reduce run in issue order, which differs across ranks. A Gloo exchange group (the
    default) is safe beside the trainer's NCCL kernels."""
    name = name or flag("read_ahead")  # named when called: the API names the field, a command its flag
    count = as_count(read_ahead, name)
    if device_max_connections is None:
        device_max_connections = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    single_queue = device_max_connections is not None and device_max_connections.strip() == "1"
    if count and exchanges and exchange_on_gpu and single_queue:
        raise ConfigError(name, f"{count} with an NCCL exchange group is refused under CUDA_DEVICE_MAX_CONNECTIONS=1: the read-ahead "
                                "thread's all_to_all and the trainer's all-reduce would run in issue order, which differs across "
                                "ranks; use a Gloo exchange group (--exchange-transport gloo) or read-ahead 0")
    return count
