"""Scenarios run on every rank of a Gloo pool: balance_iterator over collated micro-batches whose position ids
have three rows (M-RoPE), in the processor's ``[b, 3, L]`` layout or Megatron's ``[3, b, L]``."""

from __future__ import annotations

import torch
from scenarios_exchange import PAD_VALUES, check_batch, rank_result
from scenarios_plugin import SEQ_LENGTH, RankMicrobatches, _rank, _wrapper_config

from mimo_pipes.adapters.microbatch_iterator import balance_iterator
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset


def three_rows(sample_id: int, length: int) -> torch.Tensor:
    """Position ids unique to the sample: three different rows."""
    base = torch.arange(length)
    return torch.stack([base, base // 2 + sample_id, base * 3 + 7 * sample_id])


class ThreeRowMicrobatches(RankMicrobatches):
    """The rank's collated micro-batches with three-row position ids (``mrope_first``: as ``[3, b, L]``)."""

    def __init__(self, *args, mrope_first: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.mrope_first = mrope_first

    def __getitem__(self, step):
        batch = super().__getitem__(step)
        lengths = batch["attention_mask"].sum(dim=1).tolist()
        positions = torch.zeros((len(lengths), 3, batch["input_ids"].shape[1]), dtype=torch.int64)
        for row, (sample_id, n) in enumerate(zip(batch["sample_ids"], lengths)):
            positions[row, :, :n] = three_rows(sample_id, n)
        batch["position_ids"] = positions.transpose(0, 1).contiguous() if self.mrope_first else positions
        return batch


def run_three_row_positions(components, *, steps, micro_batch_size, seed, mrope_first, pack_sequences, window_size=2):
    """Every output row's position ids are its sample's, in the layout they came in; padding holds 0."""
    rank = _rank(components)
    if rank is None:
        return None
    position, layout = rank
    config = _wrapper_config(components, micro_batch_size, window_size, False, seed)
    dataset = SyntheticProcessedDataset(4096, seed=seed)
    source = ThreeRowMicrobatches(dataset, layout, micro_batch_size=micro_batch_size, seed=seed, with_ids=True, mrope_first=mrope_first)
    wrapped = balance_iterator(
        source.iterate(), config=config.reorder, layout=layout, micro_batch_size=micro_batch_size, image_token_id=IMAGE_TOKEN_ID,
        pad_values=PAD_VALUES, seq_length=SEQ_LENGTH, pack_sequences=pack_sequences, pack_pad_multiple=4, **({"mrope_first": True} if mrope_first else {}),
    )
    records = []
    with wrapped:
        for _ in range(steps):
            batch = next(wrapped)
            ids = batch["sample_ids"]
            positions = batch["position_ids"]
            rows = positions.transpose(0, 1) if mrope_first else positions  # [b, 3, L]
            if pack_sequences:
                assert rows.shape == (1, 3, int(batch["cu_seqlens"][-1])), tuple(positions.shape)
                starts, real = batch["cu_seqlens"].tolist(), batch["cu_seqlens_unpadded"].tolist()
                for k, sample_id in enumerate(ids):
                    n = real[k + 1] - real[k]
                    assert torch.equal(rows[0, :, starts[k] : starts[k] + n], three_rows(sample_id, n)), f"sample {sample_id}"
                    assert bool((rows[0, :, starts[k] + n : starts[k + 1]] == 0).all())
            else:
                check_batch({**batch, "position_ids": rows[:, 0]}, dataset)  # row 0 is the dataset's own arange
                assert rows.shape == (len(ids), 3, SEQ_LENGTH)
                for row, sample_id in enumerate(ids):
                    n = int(batch["attention_mask"][row].sum())
                    assert torch.equal(rows[row, :, :n], three_rows(sample_id, n)), f"sample {sample_id}"
                    assert bool((rows[row, :, n:] == 0).all())
            records.append({"step": batch["step"], "sample_ids": ids, "image_tokens": batch["image_tokens"]})
    return rank_result(position, records)
