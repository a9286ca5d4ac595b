"""Every entry point's assignment on one pool rank: `run`'s per-rank body, the SFT recipe's `build`, the
existing-pipeline recipe, `balance_iterator` over the rank's unbalanced micro-batches, and the DataLoader
adapter. Each returns, per global step, the sample ids this rank consumed."""

from __future__ import annotations

import dataclasses

from scenarios_jobs import run_job

from mimo_pipes.adapters.torchdata_pipeline import balanced_loader
from mimo_pipes.cli.commands.run_cmd import prepare_job
from mimo_pipes.cli.main import build_parser
from mimo_pipes.cli.rank.setup import set_up_rank
from mimo_pipes_recipes import existing_pipeline, vlm_sft


def _steps(batches) -> dict[int, list[int]]:
    return {int(batch["step"]): list(batch["sample_ids"]) for batch in batches}


def _take(loader, steps: int) -> list[dict]:
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == steps:
            break
    return batches


def entry_point_assignments(argv: list[str]) -> dict | None:
    """Per entry point, ``{step: sample ids}`` of this rank, all built from ``mimo-pipes run ARGV``'s config."""
    outcome = run_job(argv)
    config, options, _ = prepare_job(build_parser().parse_args(["run", *argv]))
    steps = options.steps
    setup = set_up_rank(config)  # collective over the whole pool: its spare ranks take part, then leave
    if setup is None:
        return None
    position, layout = setup.position, setup.layout
    mine = [r for r in outcome["result"].records if (r["module"], r["dp_rank"]) == (position.module.name, position.dp_rank)
            and r["tp_rank"] == position.tp_rank and r["pp_rank"] == position.pp_rank]
    out = {"module": position.module.name, "dp_rank": position.dp_rank, "run": {r["step"]: r["sample_ids"] for r in mine}}

    loader = vlm_sft.build(config, layout)
    out["vlm_sft.build"] = _steps(_take(loader, steps))
    loader.close()

    processor = vlm_sft.open_processor(config)
    dataset = vlm_sft.open_source(vlm_sft.dataset_path(config))
    pad_values = {"input_ids": processor.pad_token_id, "labels": -100}
    samples = existing_pipeline.example_samples(dataset, micro_batch_size=config.micro_batch_size, layout=layout, seed=config.seed,
                                                map_fn=processor)
    loader = balanced_loader(samples, reorder=config.reorder, layout=layout, micro_batch_size=config.micro_batch_size,
                                     seq_length=config.seq_length, image_token_id=processor.placeholder_ids, pad_values=pad_values,
                                     components=config.components)
    out["existing_pipeline"] = _steps(_take(loader, steps))
    loader.close()

    # balance_iterator over what a loader without reordering hands this rank (its canonical shard, collated).
    from mimo_pipes.adapters.microbatch_iterator import balance_iterator

    plain_config = dataclasses.replace(config, reorder=dataclasses.replace(config.reorder, intra_microbatch_reorder=False,
                                                                           reorder_across_microbatches=False, reorder_two_level=False))

    def unbalanced(start: int):
        # What a plain loader of processed samples hands this rank: every field (a layout naming no module),
        # so that balance_iterator prices the micro-batches from input_ids on every module.
        graph = vlm_sft.build(plain_config, dataclasses.replace(layout, module=None), consumed_microbatches=start)
        yield from ({k: v for k, v in batch.items() if k not in ("slots", "read_steps", "image_tokens", "real_tokens", "costs")}
                    for batch in graph)

    balanced = balance_iterator(config=config.reorder, layout=layout, micro_batch_size=config.micro_batch_size,
                                image_token_id=processor.placeholder_ids, pad_values=pad_values, seq_length=config.seq_length,
                                source_factory=unbalanced, components=config.components, merge_size=processor.merge_size)
    out["balance_iterator"] = _steps(_take(balanced, steps))
    balanced.close()

    from torch.utils.data import DataLoader

    from mimo_pipes.adapters.dataloader import RankMicroBatches

    view = RankMicroBatches(lambda: vlm_sft.build(config, layout))
    out["DataLoader"] = _steps(_take(DataLoader(view, batch_size=None, num_workers=0), steps))
    view.close()
    return out
