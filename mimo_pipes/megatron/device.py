"""Where a Megatron recipe trains: CUDA GPUs over NCCL (the default, and the only fast one), or the CPU over Gloo
(every rank a CPU process: the debugging and CI path, slow).

The recipes ask this module, never ``torch.cuda`` directly, so that no line of theirs is CUDA-only. megatron-core
itself still assumes CUDA in places (allocations on ``torch.cuda.current_device()``, NCCL groups in its bridge):
on the CPU those are stood in for by whoever runs it (the project's tests do, in one helper)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class TrainingDevice:
    """``kind`` ``cuda`` (one GPU per rank, NCCL) or ``cpu`` (Gloo)."""

    kind: str = "cuda"

    BACKENDS: ClassVar[dict[str, str]] = {"cuda": "nccl", "cpu": "gloo"}

    def __post_init__(self) -> None:
        if self.kind not in DEVICES:
            raise ValueError(f"--device: one of {', '.join(DEVICES)}, got {self.kind!r}")

    @property
    def backend(self) -> str:
        return self.BACKENDS[self.kind]

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def problem(self) -> str | None:
        """Why this machine cannot train on this device (None: it can)."""
        if self.is_cuda and not torch.cuda.is_available():
            return "--device cuda: no CUDA GPU found (--device cpu trains on the CPU over Gloo: slow, for debugging and CI)"
        return None

    def select(self, local_rank: int) -> None:
        """This process's GPU (local rank modulo the node's GPUs); nothing on the CPU."""
        if self.is_cuda:
            torch.cuda.set_device(local_rank % torch.cuda.device_count())

    def gpus(self) -> int:
        """This node's GPUs (none on the CPU)."""
        return torch.cuda.device_count() if self.is_cuda else 0

    def torch_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if self.is_cuda else torch.device("cpu")

    def synchronize(self) -> None:
        """Waits for the GPU's queued work (timings end there); nothing on the CPU."""
        if self.is_cuda:
            torch.cuda.synchronize()

    def fast_matmul(self) -> None:
        """TF32 matrix products for fp32 weights on the GPU."""
        if self.is_cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

    def reset_peak_memory(self) -> None:
        if self.is_cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak_memory_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated() / 2**30 if self.is_cuda else None

    def name(self) -> str:
        return torch.cuda.get_device_name() if self.is_cuda else "cpu"


def init_distributed(device: TrainingDevice, *, timeout_s: float = 600.0) -> None:
    """torch.distributed on ``device``'s backend, from torchrun's environment (a world of one at 127.0.0.1 without
    it), this process's GPU chosen first; a group already made is kept (the GPU is still chosen)."""
    from mimo_pipes.exchange.world import join_world, joined

    rank = int(os.environ.get("RANK", 0))
    device.select(int(os.environ.get("LOCAL_RANK", rank)))
    if joined():
        return
    if device.is_cuda:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    join_world(rank, int(os.environ.get("WORLD_SIZE", 1)), timeout_s, backend=device.backend)


def to_device(value: Any, device: torch.device) -> Any:
    """Tensors of ``mimo_batch``'s keyword arguments (nested dicts) moved to ``device`` (``non_blocking``: from pinned
    host memory the copy overlaps); the rest as is."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {key: to_device(item, device) for key, item in value.items()}
    return value
