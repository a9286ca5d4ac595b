"""Checkpoint scenarios on every rank of the Gloo pool: the job's collective save with some ranks failing, and
ranks refusing to go on from positions restored from different saves."""

from __future__ import annotations

import json

from scenarios_exchange import PAD_VALUES, join_layout, make_config

from mimo_pipes.checkpoint import open_generation, read_rank_state
from mimo_pipes.cli.rank.setup import set_up_rank
from mimo_pipes.cli.rank.state_save import save_state
from mimo_pipes.errors import ConfigError, ConsumedMismatchError
from mimo_pipes.exchange.world import check_same_consumed, control_group, world_rank
from mimo_pipes.parallel.topology import build_topology
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline


def save_with_failing_ranks(components, directory: str, failing: list[int]) -> dict | None:
    """Save a generation after 3 micro-batches, then one after 6 in which the ranks ``failing`` cannot write a
    file of theirs (its folder does not exist: a real OSError). Returns what the second save raised on this
    rank and what the folder then restores for it."""
    setup = set_up_rank(make_config(components, micro_batch_size=4))
    if setup is None:
        return None
    rank = world_rank()
    save_state(setup, directory, {"num_yielded": 3, "rank": rank}, {"seed": 1}, 3)
    extra = {"no-such-folder/rank.pt": b"model"} if rank in failing else None
    try:
        save_state(setup, directory, {"num_yielded": 6, "rank": rank}, {"seed": 1}, 6, extra_files=extra)
        raised = None
    except ConfigError as error:
        raised = str(error)
    generation = open_generation(directory)
    generation.verify()
    return {"raised": raised, "restored": read_rank_state(directory, rank), "consumed": generation.consumed,
            "generations": sorted(path.name for path in generation.directory.iterdir() if path.name.startswith("generation-"))}


def restore_mixed_positions(components, *, mixed: str) -> dict | None:
    """States saved after 3 and after 5 micro-batches, restored into fresh graphs: ``mixed="modules"`` gives
    the language module the later ones (each module agrees within itself, so the job's check at start
    refuses); ``mixed="ranks"`` gives language DP rank 0 the later one (its module's first exchange refuses).
    Returns what each rank raised."""
    joined = join_layout(components)
    control = control_group(build_topology(components).world_size)  # collective over the whole pool
    if joined is None:
        return None
    topology, groups, layout = joined
    position = groups.position
    config = make_config(components, micro_batch_size=8, window_size=2, seed=3)

    def loader():
        dataset = SyntheticProcessedDataset(96, seed=3)
        return pipeline(dataset, config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID, pad_values=PAD_VALUES)

    first = loader()
    states = {}
    for count in range(1, 6):
        next(first)
        if count in (3, 5):
            states[count] = json.loads(json.dumps(first.state_dict()))
    first.close()
    later = position.module.is_language and (mixed == "modules" or position.dp_rank == 0)
    restored = loader()
    restored.load_state_dict(states[5 if later else 3])
    outcome: dict = {"module": position.module.name, "dp_rank": position.dp_rank, "raised": None}
    try:
        if mixed == "modules":
            check_same_consumed(restored.consumed_microbatches, control)
        else:
            next(restored)
    except ConsumedMismatchError as error:
        outcome["raised"] = str(error)
    restored.close()
    return outcome
