"""The bridge between an encoder module and the language module: embeddings forward, their gradients back.

Point-to-point ``send`` / ``recv`` on the world group, along the contiguous fan-out: encoder DP replica i
feeds language DP replicas [i*k, (i+1)*k). megatron-core 0.16's ``BridgeCommunicator`` does the same job
but allocates its buffers on ``torch.cuda.current_device()``, so it cannot run on Gloo on a CPU.

A block sent to one language rank is a header (rows, width, samples), the block's sample ids and the
embedding rows; the language rank checks the ids against its own micro-batch, so a pairing error is caught
at the first micro-batch instead of training on mismatched images.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from mimo_pipes.exchange.lost_peers import collective

TAG_HEADER, TAG_IDS, TAG_ROWS, TAG_GRADIENT = 101, 102, 103, 104


def split_rows(rows_per_sample: Sequence[int], targets: int) -> list[int]:
    """Embedding rows of each target's block: the samples split into ``targets`` equal contiguous blocks."""
    if len(rows_per_sample) % targets:
        raise ValueError(f"{len(rows_per_sample)} samples cannot be split evenly over {targets} language ranks")
    per_target = len(rows_per_sample) // targets
    return [sum(rows_per_sample[t * per_target : (t + 1) * per_target]) for t in range(targets)]


def send_embeddings(embeddings: torch.Tensor, sample_ids: Sequence[int], rows_per_sample: Sequence[int], targets: Sequence[int]) -> list[int]:
    """Send each target its contiguous block of samples' rows; returns the rows per target (for the gradients)."""
    rows = split_rows(rows_per_sample, len(targets))
    if sum(rows) != embeddings.shape[0]:
        raise ValueError(f"the encoder made {embeddings.shape[0]} embedding rows, the samples hold {sum(rows)} image tokens")
    per_target = len(sample_ids) // len(targets)
    values = embeddings.detach().contiguous()
    requests, keep = [], []
    start = 0
    for t, target in enumerate(targets):
        header = torch.tensor([rows[t], values.shape[1], per_target], dtype=torch.int64)
        ids = torch.tensor(list(sample_ids[t * per_target : (t + 1) * per_target]), dtype=torch.int64)
        block = values[start : start + rows[t]].contiguous()
        start += rows[t]
        keep += [header, ids, block]
        requests += [
            dist.isend(header, target, tag=TAG_HEADER),
            dist.isend(ids, target, tag=TAG_IDS),
            dist.isend(block, target, tag=TAG_ROWS),
        ]
    _wait(requests, "sending image embeddings")
    return rows


def recv_embeddings(source: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, list[int]]:
    """This language rank's block from its encoder rank: (rows x width embeddings, sample ids)."""
    header = torch.empty(3, dtype=torch.int64)
    _wait([dist.irecv(header, source, tag=TAG_HEADER)], "receiving image embeddings")
    rows, width, samples = (int(v) for v in header)
    ids = torch.empty(samples, dtype=torch.int64)
    values = torch.empty(rows, width, dtype=dtype)
    _wait([dist.irecv(ids, source, tag=TAG_IDS), dist.irecv(values, source, tag=TAG_ROWS)], "receiving image embeddings")
    return values, ids.tolist()


def send_gradient(gradient: torch.Tensor, source: int) -> None:
    """Send the loss's gradient with respect to the received embeddings back to the encoder rank."""
    _wait([dist.isend(gradient.contiguous(), source, tag=TAG_GRADIENT)], "sending embedding gradients")


def recv_gradients(targets: Sequence[int], rows: Sequence[int], width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The gradients of every block sent by :func:`send_embeddings`, concatenated in the same order."""
    blocks = [torch.empty(count, width, dtype=dtype) for count in rows]
    _wait([dist.irecv(block, target, tag=TAG_GRADIENT) for block, target in zip(blocks, targets)], "receiving embedding gradients")
    return torch.cat(blocks)


def _wait(requests: list, what: str) -> None:
    with collective(what):
        for request in requests:
            request.wait()
