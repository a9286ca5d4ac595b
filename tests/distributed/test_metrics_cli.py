"""`mimo-pipes run --tensorboard`: the exchange's metrics, read back from the event files, agree with what
the ranks consumed (`--dump-assignments`) and with where the readers placed the samples (the job's per-rank
body on the pool's Gloo ranks)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from job_runs import run_in_pool
from test_cli_run import read_dumps

from mimo_pipes.parallel.sharding import shard_indices

SAMPLES, BATCH, SEED, STEPS, DP = 48, 4, 9, 8, 2
COMMON = ["--component", f"language=dp={DP}", "--steps", str(STEPS), "--micro-batch-size", str(BATCH),
          "--embedded-samples", str(SAMPLES), "--seed", str(SEED), "--scalable-dp", "--intra-microbatch-reorder"]


def read_scalars(directory) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {event.step: event.value for event in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def expected_figures(dumps: dict[int, list[dict]], window: int) -> dict[int, dict[str, float]]:
    """Per window (keyed by its first step): loads and moves recomputed from the dumps and the readers' shards."""
    tokens: dict[int, int] = {}
    after = defaultdict(lambda: [0] * DP)  # step -> per-rank image tokens as consumed
    holder: dict[int, int] = {}  # sample id -> DP rank that consumed it
    for records in dumps.values():
        for record in records:
            after[record["step"]][record["dp_rank"]] += sum(record["image_tokens"])
            for sample_id, count in zip(record["sample_ids"], record["image_tokens"]):
                tokens[sample_id] = count
                holder[sample_id] = record["dp_rank"]
    before = {}
    reader: dict[int, int] = {}
    for step in range(STEPS):
        before[step] = []
        for rank in range(DP):
            ids = shard_indices(step, rank, DP, SAMPLES, BATCH, SEED, shuffle=True).tolist()
            before[step].append(sum(tokens[i] for i in ids))
            reader.update(dict.fromkeys(ids, rank))
    figures = {}
    for first in range(0, STEPS, window):
        steps = range(first, first + window)
        entry: dict[str, float] = {}
        for when, loads in (("before", before), ("after", after)):
            rows = [loads[step] for step in steps]
            entry[f"{when}/critical_path"] = sum(max(row) for row in rows)
            entry[f"{when}/spread"] = sum(max(row) - min(row) for row in rows) / window
            entry[f"{when}/mean"] = sum(sum(row) for row in rows) / (window * DP)
            for rank in range(DP):
                entry[f"{when}/per_rank/{rank}"] = sum(row[rank] for row in rows)
        ids = [i for step in steps for i in shard_indices(step, 0, 1, SAMPLES, BATCH, SEED, shuffle=True).tolist()]
        entry["moved"] = sum(1 for i in ids if holder[i] != reader[i])
        figures[first] = entry
    return figures


@pytest.mark.parametrize("window,across", [(1, False), (1, True), (4, False), (4, True)])
def test_tensorboard_metrics_agree_with_the_dumps(gloo_pool, tmp_path, window, across):
    args = [*COMMON, "--reorder-window-size", str(window), "--tensorboard", str(tmp_path / "tb"),
            "--dump-assignments", str(tmp_path / "dumps"), "--log-interval", "1"]
    stderr = run_in_pool(gloo_pool, [*args, *(["--reorder-across-microbatches"] if across else [])])["stderr"]
    dumps = read_dumps(tmp_path / "dumps")
    scalars = read_scalars(tmp_path / "tb" / "language")
    expected = expected_figures(dumps, window)
    assert sorted(scalars["image_tokens/after/critical_path"]) == sorted(expected)  # one point per window
    for first, entry in expected.items():
        for name, value in entry.items():
            tag = "moved/samples" if name == "moved" else f"image_tokens/{name}"
            assert scalars[tag][first] == pytest.approx(value, rel=1e-6), (first, tag)
        assert scalars["image_tokens/after/critical_path"][first] >= scalars["image_tokens/critical_path_lower_bound"][first]
        assert scalars["image_tokens/after/spread"][first] == pytest.approx(
            scalars["image_tokens/after/max"][first] - scalars["image_tokens/after/min"][first], abs=1e-3)
    last = max(expected)
    for when in ("before", "after"):
        total = sum(entry[f"{when}/critical_path"] for entry in expected.values())
        assert scalars[f"cumulative/image_tokens/{when}/critical_path"][last] == total
    assert scalars["cumulative/windows"][last] == STEPS // window
    assert scalars["cumulative/moved/samples"][last] == sum(entry["moved"] for entry in expected.values())
    # A metrics line per window on DP rank 0 (log interval 1), none from rank 1.
    assert stderr.count("exchange metrics: language:") == STEPS // window
    assert f"language: {STEPS // window} windows, {STEPS} micro-batches" in stderr


def test_tensorboard_needs_reordering(tmp_path, capsys):
    from mimo_pipes.cli.main import main

    assert main(["run", "--steps", "2", "--tensorboard", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--tensorboard" in err and "Traceback" not in err
