"""Copies made on a processing worker: on that worker's own core, never through torch's intra-op thread pool.

A worker's one large copy per sample (its pixels into its micro-batch's buffer, or into the shared memory it
hands them over in) ran as ``Tensor.copy_``, which splits a copy of more than 32K elements over torch's
intra-op threads: a team of as many threads as the host has cores, made for every thread that calls it. With
14 worker threads (or processes) on a 16-core host that is up to 14 teams of 16 threads, each copy waiting for
its slowest member among 200-odd busy threads. The workers are the parallelism already (torch's own
``DataLoader`` sets one intra-op thread in its workers for the same reason), so the copy runs here on the
calling thread: NumPy's copy of the bytes, which lets the GIL go while it runs. The bytes are the same.
"""

from __future__ import annotations

import numpy as np
import torch


def copy_into(target: torch.Tensor, value: torch.Tensor) -> None:
    """``target[...] = value`` (same shape and dtype) on the calling thread alone, the GIL released during the copy."""
    if target.shape != value.shape or target.dtype != value.dtype:
        raise ValueError(f"copy_into: target {tuple(target.shape)} {target.dtype} and value {tuple(value.shape)} {value.dtype} differ")
    if value.numel() == 0:
        return
    if not (target.is_contiguous() and value.is_contiguous()) or target.device.type != "cpu" or value.device.type != "cpu":
        target.copy_(value)  # not the workers' case (contiguous CPU tensors); left to torch
        return
    # As bytes: every dtype, bfloat16 included (NumPy has none), and np.copyto releases the GIL for them.
    np.copyto(target.reshape(-1).view(torch.uint8).numpy(), value.reshape(-1).view(torch.uint8).numpy())


def one_thread_per_worker() -> None:
    """In a worker process: torch's intra-op threads down to one (what torch's DataLoader does in its workers)."""
    torch.set_num_threads(1)
