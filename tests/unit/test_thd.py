"""Sequence packing (THD) of collated micro-batches: the pure functions and the SequencePacker node."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchdata.nodes import IterableWrapper

from mimo_pipes.errors import SampleError
from mimo_pipes.nodes import SequencePacker
from mimo_pipes.samples.collate import collate_microbatch
from mimo_pipes.samples.thd import (
    CU_SEQLENS,
    CU_SEQLENS_UNPADDED,
    MAX_SEQLEN,
    pack_microbatch,
    packing_metrics,
    token_fields,
    unpack_sequences,
)
from mimo_pipes.testing import tail_settings

PAD_VALUES = {"input_ids": 7, "labels": -100}
PATCH_DIM = 6


def padded_batch(lengths, extra, *, mrope, with_positions=True, seed=0):
    """A collated micro-batch as a real-data collator makes it: right-padded token fields [b, L] (and M-RoPE
    position ids [b, 3, L]), vision rows concatenated in sample order, per-sample fields, metadata lists."""
    generator = torch.Generator().manual_seed(seed)
    rows, length = len(lengths), max(lengths, default=0) + extra
    batch = {"step": 3, "sample_ids": [100 + i for i in range(rows)], "image_tokens": [n // 3 for n in lengths]}
    batch["input_ids"] = torch.full((rows, length), PAD_VALUES["input_ids"], dtype=torch.int64)
    batch["labels"] = torch.full((rows, length), -100, dtype=torch.int64)
    batch["loss_mask"] = torch.zeros((rows, length), dtype=torch.float32)
    batch["attention_mask"] = torch.zeros((rows, length), dtype=torch.int64)
    if with_positions:
        batch["position_ids"] = torch.zeros((rows, 3, length) if mrope else (rows, length), dtype=torch.int64)
    for row, n in enumerate(lengths):
        batch["input_ids"][row, :n] = torch.randint(10, 1000, (n,), generator=generator)
        batch["labels"][row, :n] = torch.where(torch.rand(n, generator=generator) < 0.5, batch["input_ids"][row, :n], -100)
        batch["loss_mask"][row, :n] = (batch["labels"][row, :n] != -100).float()
        batch["attention_mask"][row, :n] = 1
        if with_positions and mrope:  # three rows that differ, as Qwen2-VL's rope index gives for images
            batch["position_ids"][row, :, :n] = torch.stack([torch.arange(n), torch.arange(n) // 2, torch.arange(n) % 5])
        elif with_positions:
            batch["position_ids"][row, :n] = torch.arange(n)
    patches = [n % 4 * 4 for n in lengths]
    batch["pixel_values"] = torch.randn(sum(patches), PATCH_DIM, generator=generator)
    batch["image_grid_thw"] = torch.tensor([[1, 2, p // 2] for p in patches if p], dtype=torch.int64).reshape(-1, 3)
    batch["num_images"] = torch.tensor([int(p > 0) for p in patches])  # per-sample tensor [b]: passes through
    batch["origin"] = [f"row{row}" for row in range(rows)]
    return batch


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=6).filter(any),
    extra=st.integers(0, 5),
    pad_multiple=st.integers(1, 8),
    mrope=st.booleans(),
    with_positions=st.booleans(),
)
def test_packed_and_padded_hold_the_same_samples(lengths, extra, pad_multiple, mrope, with_positions):
    batch = padded_batch(lengths, extra, mrope=mrope, with_positions=with_positions)
    kept = {name: value.clone() if isinstance(value, torch.Tensor) else list(value) if isinstance(value, list) else value
            for name, value in batch.items()}
    packed = pack_microbatch(batch, pad_multiple=pad_multiple, pad_values=PAD_VALUES)
    for name, value in kept.items():  # the collated batch is left as it was
        assert type(batch[name]) is type(value) and (torch.equal(batch[name], value) if isinstance(value, torch.Tensor) else batch[name] == value)

    cu, cu_real = packed[CU_SEQLENS], packed[CU_SEQLENS_UNPADDED]
    assert cu.dtype == cu_real.dtype == torch.int32
    assert cu_real.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    spans = (cu[1:] - cu[:-1]).tolist()
    assert all(span % pad_multiple == 0 and n <= span < n + pad_multiple for span, n in zip(spans, lengths))
    assert packed[MAX_SEQLEN] == max(spans)
    total = int(cu[-1])
    assert "attention_mask" not in packed
    for name in ("input_ids", "labels", "loss_mask"):
        assert packed[name].shape == (1, total) and packed[name].dtype == batch[name].dtype
    assert packed["position_ids"].shape == ((1, 3, total) if mrope and with_positions else (1, total))

    # Sample by sample: the same tokens, labels, loss mask and position ids as the padded row.
    for row, n in enumerate(lengths):
        start = int(cu[row])
        for name in ("input_ids", "labels", "loss_mask"):
            assert torch.equal(packed[name][0, start : start + n], batch[name][row, :n]), (name, row)
            pad = packed[name][0, start + n : int(cu[row + 1])]
            assert torch.all(pad == {"input_ids": 7, "labels": -100, "loss_mask": 0}[name]), (name, row)
        positions = packed["position_ids"][0, ..., start : start + n]
        if with_positions:
            assert torch.equal(positions, batch["position_ids"][row, ..., :n])
        else:
            assert torch.equal(positions, torch.arange(n))  # restart at 0 in every sequence
    assert [s["input_ids"].tolist() for s in unpack_sequences(packed)] == [batch["input_ids"][r, :n].tolist() for r, n in enumerate(lengths)]
    # Images and everything per-sample: unchanged and in sample order.
    for name in ("pixel_values", "image_grid_thw", "num_images"):
        assert torch.equal(packed[name], batch[name])
    for name in ("step", "sample_ids", "image_tokens", "origin"):
        assert packed[name] == batch[name]
    metrics = packing_metrics(batch, packed)
    assert metrics.real_tokens == sum(lengths) and metrics.packed_tokens == total
    assert metrics.padding_fraction_before == pytest.approx(1 - sum(lengths) / (len(lengths) * batch["input_ids"].shape[1]))
    assert metrics.padding_fraction_after == pytest.approx(1 - sum(lengths) / total)
    if pad_multiple == 1:
        assert metrics.padding_fraction_after == 0 and torch.equal(cu, cu_real)


def test_a_batch_from_the_collator_packs_like_its_samples():
    samples = [
        {"input_ids": torch.arange(1, n + 1), "attention_mask": torch.ones(n, dtype=torch.int64),
         "labels": torch.arange(n), "pixel_values": torch.full((n, 2), float(n)), "sample_id": n, "step": 0}
        for n in (3, 5, 1)
    ]
    batch = collate_microbatch(samples, pad_length=8)
    packed = pack_microbatch(batch, pad_multiple=2)
    assert packed[CU_SEQLENS].tolist() == [0, 4, 10, 12]
    assert packed[CU_SEQLENS_UNPADDED].tolist() == [0, 3, 8, 9]
    assert packed["input_ids"].tolist() == [[1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1, 0]]
    assert packed["labels"].tolist() == [[0, 1, 2, -100, 0, 1, 2, 3, 4, -100, 0, -100]]
    assert packed["position_ids"].tolist() == [[0, 1, 2, 0, 0, 1, 2, 3, 4, 0, 0, 0]]
    assert torch.equal(packed["pixel_values"], batch["pixel_values"])
    assert packed["sample_ids"] == [3, 5, 1]


def test_token_fields_are_found_by_shape_and_vision_fields_never_are():
    batch = padded_batch([4, 6], 0, mrope=True)
    batch["pixel_values"] = torch.zeros(2, 6)  # [b, L] by coincidence: still a vision field
    batch["video_second_per_grid"] = torch.ones(2)
    assert sorted(token_fields(batch)) == ["attention_mask", "input_ids", "labels", "loss_mask", "position_ids"]
    packed = pack_microbatch(batch)
    assert packed["pixel_values"].shape == (2, 6)


def test_bad_rows_are_refused_with_the_sample_named():
    batch = padded_batch([3, 4], 2, mrope=False)
    batch["attention_mask"][1] = torch.tensor([0, 0, 1, 1, 1, 1])  # left padding
    with pytest.raises(SampleError, match="sample 101.*right-padded"):
        pack_microbatch(batch)
    del batch["attention_mask"]
    with pytest.raises(ValueError, match="micro-batch 3: sequence packing needs attention_mask"):
        pack_microbatch(batch)
    with pytest.raises(ValueError, match="pad_multiple"):
        pack_microbatch(padded_batch([3], 0, mrope=False), pad_multiple=0)


def test_node_packs_each_microbatch_and_keeps_its_source_state():
    batches = [padded_batch([n, n + 2, 1], 3, mrope=False, seed=n) for n in range(1, 6)]
    node = SequencePacker(IterableWrapper(batches), settings=tail_settings(samples_per_rank=3, pad_values=PAD_VALUES, pack_pad_multiple=4))
    node.reset()
    first = [next(node) for _ in range(2)]
    assert node.last_metrics["tokens_per_packed_row"] == int(first[1][CU_SEQLENS][-1])
    assert node.last_metrics["padding_fraction_before"] > node.last_metrics["padding_fraction_after"]
    state = node.state_dict()
    assert set(state) == {SequencePacker.SOURCE_KEY}
    rest = [next(node) for _ in range(3)]
    with pytest.raises(StopIteration):
        next(node)
    restored = SequencePacker(IterableWrapper(batches), settings=tail_settings(samples_per_rank=3, pad_values=PAD_VALUES, pack_pad_multiple=4))
    restored.reset(state)
    assert restored.last_metrics is None
    for want in rest:
        got = next(restored)
        assert torch.equal(got["input_ids"], want["input_ids"]) and torch.equal(got[CU_SEQLENS], want[CU_SEQLENS])
    with pytest.raises(ValueError, match="pad_multiple"):
        SequencePacker(IterableWrapper(batches), settings=tail_settings(samples_per_rank=3, pack_pad_multiple=0))
