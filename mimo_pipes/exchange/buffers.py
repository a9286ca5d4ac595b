"""Byte buffers an exchanging thread keeps from one window to the next."""

from __future__ import annotations

import torch


class ExchangeBuffers:
    """Byte buffers kept from one window to the next by one exchanging thread.

    Reusing them spares touching fresh memory every window (page faults cost more than a copy). Only
    for callers that unpack the received samples as copies, or copy them out before their next exchange:
    received tensors are otherwise views of the receive buffer. Costs one window's sent and received bytes of memory.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, str], torch.Tensor] = {}

    def get(self, name: str, nbytes: int, device: torch.device | None = None, pinned: bool = False) -> torch.Tensor:
        key = (name, str(device))
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < nbytes:
            # Room to grow; host buffers that stage GPU copies are pinned (page-locked copies run at full speed).
            buffer = torch.empty(nbytes + nbytes // 4, dtype=torch.uint8, device=device, pin_memory=pinned)
            self._buffers[key] = buffer
        return buffer[:nbytes]


def new_buffer(name: str, nbytes: int, device: torch.device | None = None, pinned: bool = False) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


