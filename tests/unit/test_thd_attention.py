"""A tiny rotary attention model gives the same per-sample logits on a packed (THD) micro-batch as on the
padded one: block-diagonal attention from cu_seqlens, and a varlen-style loop over the sequences.

Tolerance: float32, atol 1e-5 and rtol 1e-4 (the layouts sum the same terms in other orders)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mimo_pipes.samples.thd import CU_SEQLENS, CU_SEQLENS_UNPADDED, pack_microbatch

VOCAB, DIM, HEADS, MAX_POSITION = 64, 32, 4, 128
ATOL, RTOL = 1e-5, 1e-4


def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [..., T, D] at integer positions [..., T]."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    angles = positions[..., None].float() * freqs
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([x[..., :half] * cos - x[..., half:] * sin, x[..., :half] * sin + x[..., half:] * cos], dim=-1)


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.position = nn.Embedding(MAX_POSITION, DIM)  # absolute, besides rotary (which is shift-invariant)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """input_ids, position_ids [b, T]; allowed [b, T, T]: query t may attend to key s."""
        b, t = input_ids.shape
        x = self.embed(input_ids) + self.position(position_ids)
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, position_ids[:, None]), rotate(k, position_ids[:, None])
        scores = (q @ k.transpose(-1, -2)) / (DIM // HEADS) ** 0.5
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        attended = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v  # pad queries attend to nothing
        x = x + self.out(attended.transpose(1, 2).reshape(b, t, DIM))
        return self.head(x + self.mlp(x))


def padded_mask(attention_mask: torch.Tensor, causal: bool) -> torch.Tensor:
    t = attention_mask.shape[1]
    keys = attention_mask.bool()[:, None, :].expand(-1, t, -1)
    return keys & torch.ones(t, t, dtype=torch.bool).tril() if causal else keys


def block_diagonal_mask(cu_seqlens: torch.Tensor, cu_seqlens_unpadded: torch.Tensor, causal: bool) -> torch.Tensor:
    """[1, T, T] from cu_seqlens alone: keys of the query's own sequence, real tokens only."""
    total = int(cu_seqlens[-1])
    index = torch.arange(total)
    sequence = torch.bucketize(index, cu_seqlens[1:].long(), right=True)
    lengths = (cu_seqlens_unpadded[1:] - cu_seqlens_unpadded[:-1]).long()
    real = index - cu_seqlens[:-1].long()[sequence] < lengths[sequence]
    allowed = (sequence[:, None] == sequence[None, :]) & real[None, :]
    return (allowed & (index[:, None] >= index[None, :]) if causal else allowed)[None]


def microbatch(lengths, length, generator):
    rows = len(lengths)
    batch = {"input_ids": torch.zeros(rows, length, dtype=torch.int64), "attention_mask": torch.zeros(rows, length, dtype=torch.int64),
             "position_ids": torch.zeros(rows, length, dtype=torch.int64), "labels": torch.full((rows, length), -100)}
    for row, n in enumerate(lengths):
        batch["input_ids"][row, :n] = torch.randint(1, VOCAB, (n,), generator=generator)
        batch["attention_mask"][row, :n] = 1
        batch["position_ids"][row, :n] = torch.arange(n)
        batch["labels"][row, :n] = batch["input_ids"][row, :n]
    return batch


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pad_multiple", [1, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packed_layout_gives_the_padded_logits(causal, pad_multiple, seed):
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = TinyLM().eval()
    lengths = torch.randint(1, 24, (5,), generator=generator).tolist()
    batch = microbatch(lengths, max(lengths) + 3, generator)
    packed = pack_microbatch(batch, pad_multiple=pad_multiple)
    cu, cu_real = packed[CU_SEQLENS], packed[CU_SEQLENS_UNPADDED]
    with torch.no_grad():
        padded_logits = model(batch["input_ids"], batch["position_ids"], padded_mask(batch["attention_mask"], causal))
        packed_logits = model(packed["input_ids"], packed["position_ids"], block_diagonal_mask(cu, cu_real, causal))
        for row, n in enumerate(lengths):
            start = int(cu[row])
            want = padded_logits[row, :n]
            torch.testing.assert_close(packed_logits[0, start : start + n], want, atol=ATOL, rtol=RTOL)
            # varlen-style: each sequence alone, cut out of the packed row by cu_seqlens_unpadded
            alone = slice(start, start + int(cu_real[row + 1] - cu_real[row]))
            ids, positions = packed["input_ids"][:, alone], packed["position_ids"][:, alone]
            full = torch.ones(1, n, n, dtype=torch.bool)
            varlen = model(ids, positions, full.tril() if causal else full)
            torch.testing.assert_close(varlen[0], want, atol=ATOL, rtol=RTOL)


def test_position_ids_matter_so_the_comparison_can_fail():
    generator = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    model = TinyLM().eval()
    batch = microbatch([6, 9], 9, generator)
    packed = pack_microbatch(batch)
    mask = block_diagonal_mask(packed[CU_SEQLENS], packed[CU_SEQLENS_UNPADDED], True)
    with torch.no_grad():
        right = model(packed["input_ids"], packed["position_ids"], mask)
        running = model(packed["input_ids"], torch.arange(15)[None], mask)  # positions not restarted
        padded = model(batch["input_ids"], batch["position_ids"], padded_mask(batch["attention_mask"], True))
    torch.testing.assert_close(right[0, 6:15], padded[1, :9], atol=ATOL, rtol=RTOL)
    assert not torch.allclose(running[0, 6:15], padded[1, :9], atol=1e-3)
