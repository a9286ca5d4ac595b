"""One tail for every entry point: with a time model (its floor in the planner) and with two-level balance,
`run`, the recipes' builders, `balance_iterator`, the DataLoader adapter and `analyze`'s replay give every
rank the same samples at every step."""

from __future__ import annotations

import pytest
from scenarios_entry_points import entry_point_assignments

from mimo_pipes.analysis.analyze import analyze
from mimo_pipes.cli.commands.run_cmd import prepare_job
from mimo_pipes.cli.job.recipe import load_recipe
from mimo_pipes.cli.main import build_parser
from mimo_pipes.parallel.sharding import global_microbatch_indices
from mimo_pipes.time_model import TimeModel, save_time_model

MODEL = TimeModel(floor_ps=20_000_000_000, per_image_ps=1_000_000_000, per_patch_ps=5_500_000, per_patch_squared_ps=400)
COMMON = ["--component", "language=dp=2,rank_offset=0", "--component", "images=dp=1,rank_offset=2", "--micro-batch-size", "4",
          "--steps", "4", "--embedded-samples", "48", "--seed", "3", "--quiet", "--scalable-dp", "--intra-microbatch-reorder"]
SETTINGS = {
    "time model, windows of 2 across": ["--reorder-cost-model", "{model}", "--reorder-window-size", "2", "--reorder-across-microbatches"],
    "two-level": ["--reorder-two-level"],
    "two-level with a time model": ["--reorder-two-level", "--reorder-cost-model", "{model}"],
}


def analyze_assignment(argv: list[str]) -> dict[tuple[str, int], dict[int, list[int]]]:
    """What analyze's replay gives each (module, DP rank) at each step: its canonical positions' rows."""
    config, options, _ = prepare_job(build_parser().parse_args(["run", *argv]))
    topology = config.validate()
    model = config.reorder.load_time_model()
    counts = load_recipe(options.recipe).row_counts(config, real_tokens=True, runs=model is not None)
    result = analyze(config, topology, counts.image_tokens, counts.real_tokens, start=0, stop=options.steps,
                     encoder_costs=counts.encoder_costs(model) if model is not None else None)
    out = {}
    for module in topology.modules:
        per_rank = config.micro_batch_size // module.dp
        for rank in range(module.dp):
            rows = result.replay.after[:, rank * per_rank:(rank + 1) * per_rank]
            out[module.name, rank] = {int(step): [int(r) for r in row] for step, row in zip(result.replay.steps, rows)}
    return out


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_entry_point_gives_runs_assignment(gloo_pool, tmp_path, name):
    model = str(save_time_model(MODEL, tmp_path / "model.json"))
    argv = [*COMMON, *(model if flag == "{model}" else flag for flag in SETTINGS[name])]
    outcomes = [o for o in gloo_pool.run(entry_point_assignments, argv, timeout=600) if o]
    assert len(outcomes) == 3
    replayed = analyze_assignment(argv)
    for outcome in outcomes:
        run = outcome["run"]
        assert sorted(run) == [0, 1, 2, 3]
        for entry in ("vlm_sft.build", "existing_pipeline", "balance_iterator", "DataLoader"):
            assert outcome[entry] == run, (name, entry, outcome["module"], outcome["dp_rank"])
        assert replayed[outcome["module"], outcome["dp_rank"]] == run, (name, "analyze", outcome["module"])
    language = {o["dp_rank"]: o["run"] for o in outcomes if o["module"] == "language"}
    images = next(o["run"] for o in outcomes if o["module"] == "images")
    read = {step: [int(i) for i in global_microbatch_indices(step, 48, 4, 3, True)] for step in range(4)}
    window = 2 if "across" in name else 1  # samples may move between the micro-batches of a window
    for step in range(4):
        assert images[step] == language[0][step] + language[1][step]  # the fan-out pairs replica 0 with languages 0 and 1
    for first in range(0, 4, window):
        steps = range(first, first + window)
        assert sorted(i for s in steps for i in images[s]) == sorted(i for s in steps for i in read[s])  # what the readers read
    # Balancing did something: some rank's samples are not its reader's shard.
    assert any(language[0][step] != read[step][:2] for step in range(4))
