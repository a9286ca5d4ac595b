"""Scenario run on every rank of a Gloo pool: the recipe over a real-format dataset and processor folder,
checking every collated micro-batch's labels against the row's assistant replies."""

from __future__ import annotations

from real_data import num_images, replies
from scenarios_exchange import rank_result
from scenarios_plugin import _rank

from mimo_pipes.config import DEFAULT_COMPONENTS, PipelineConfig, ReorderConfig
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.samples.collate import VISION_ROWS
from mimo_pipes_recipes.vlm_sft import build


def real_data_config(dataset, image_folder, processor, *, seed, micro_batch_size=4, window_size=2) -> PipelineConfig:
    return PipelineConfig(
        components=DEFAULT_COMPONENTS, micro_batch_size=micro_batch_size, seq_length=1024, seed=seed, num_workers=1,
        dataset=dataset, processor=processor, image_folder=image_folder,
        reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=window_size),
    )


def run_real_data(dataset, image_folder, processor, *, steps, seed):
    rank = _rank(DEFAULT_COMPONENTS)
    if rank is None:
        return None
    position, layout = rank
    config = real_data_config(dataset, image_folder, processor, seed=seed)
    tokenizer = load_processor(processor, config.seq_length).tokenizer
    loader = build(config, layout)
    declared = set(load_processor(processor, config.seq_length).vision_fields)
    records = []
    for batch in loader:
        assert declared <= set(batch), f"micro-batch {batch['step']} lacks {declared - set(batch)}"
        for row, sample_id in enumerate(batch["sample_ids"]):
            labels = batch["labels"][row]
            trained = tokenizer.decode(labels[labels != -100].tolist())
            expected = "".join(reply + "<|im_end|>" for reply in replies(sample_id))
            assert trained == expected, f"row {sample_id}: trains {trained!r}, expected {expected!r}"
            assert (batch[VISION_ROWS]["pixel_values"][row] > 0) == (num_images(sample_id) > 0)
        records.append({"step": batch["step"], "sample_ids": batch["sample_ids"]})
        if loader.consumed_microbatches >= steps:
            break
    loader.close()
    return rank_result(position, records)


def _fingerprint(batch) -> tuple:
    return batch["step"], list(batch["sample_ids"]), int(batch["input_ids"].sum()), float(batch["pixel_values"].sum())


def _take(iterable, count) -> list[tuple]:
    iterator = iter(iterable)
    return [_fingerprint(next(iterator)) for _ in range(count)]


def run_dataloaders(dataset, image_folder, processor, *, steps, stop, seed):
    """The graph's own loader, a DataLoader and a StatefulDataLoader (stopped at ``stop``, its state
    saved, a new one restored from it) over the same rank: their streams."""
    import json

    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    from mimo_pipes.adapters.dataloader import RankMicroBatches

    rank = _rank(DEFAULT_COMPONENTS)
    if rank is None:
        return None
    position, layout = rank
    config = real_data_config(dataset, image_folder, processor, seed=seed)
    own_loader = build(config, layout)
    own = _take(own_loader, steps)
    own_loader.close()
    view = RankMicroBatches(lambda: build(config, layout))
    plain = _take(DataLoader(view, batch_size=None, num_workers=0), steps)
    view.close()
    first_view = RankMicroBatches(lambda: build(config, layout))
    first_loader = StatefulDataLoader(first_view, batch_size=None, num_workers=0)
    head = _take(first_loader, stop)
    state = json.loads(json.dumps(first_loader.state_dict(), default=str))
    first_view.close()
    second_view = RankMicroBatches(lambda: build(config, layout))
    second_loader = StatefulDataLoader(second_view, batch_size=None, num_workers=0)
    second_loader.load_state_dict(state)
    tail = _take(second_loader, steps - stop)
    second_view.close()
    return rank_result(position, [], own=own, plain=plain, resumed=head + tail)


class WithMRoPE:
    """A user's map function: the processor's sample with three-row position ids (t, h, w), as Qwen2-VL's
    M-RoPE uses (here every row counts the token index plus its row number, easy to check)."""

    def __init__(self, processor) -> None:
        self.processor = processor

    def __call__(self, row):
        import torch

        sample = self.processor(row)
        length = sample["input_ids"].shape[0]
        sample["position_ids"] = torch.arange(length).expand(3, length) + torch.arange(3)[:, None]
        return sample


def run_mrope(dataset, image_folder, processor_path, *, steps, seed):
    from mimo_pipes.data.sources.open_source import open_source
    from mimo_pipes_recipes.vlm_sft import pipeline

    rank = _rank(DEFAULT_COMPONENTS)
    if rank is None:
        return None
    position, layout = rank
    config = real_data_config(dataset, image_folder, processor_path, seed=seed)
    processor = load_processor(processor_path, config.seq_length, image_folder=image_folder)
    loader = pipeline(open_source(dataset), config, layout, map_fn=WithMRoPE(processor), image_token_id=processor.placeholder_ids,
                      pad_values={"input_ids": processor.pad_token_id, "labels": -100}, vision_fields=processor.vision_fields)
    records = []
    for batch in loader:
        rows, length = batch["input_ids"].shape
        assert batch["position_ids"].shape == (rows, 3, length)
        for row in range(rows):
            real = int(batch["attention_mask"][row].sum())
            expected = [list(range(k, k + real)) for k in range(3)]
            assert batch["position_ids"][row, :, :real].tolist() == expected
            assert not batch["position_ids"][row, :, real:].any()  # padding
        records.append({"step": batch["step"], "sample_ids": batch["sample_ids"]})
        if loader.consumed_microbatches >= steps:
            break
    loader.close()
    return rank_result(position, records)
