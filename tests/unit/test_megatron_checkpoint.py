"""The pipeline's state inside a Megatron checkpoint's iteration folder, on one process: saved at iteration k,
committed with the iteration (Megatron's tracker), a save killed part-way leaves iteration k whole, and a
loader restored from it continues the uninterrupted stream exactly (inside a window whose samples moved
between micro-batches). Multi-rank saves and another layout: tests/distributed/test_megatron_resume.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scenarios_resume import fingerprint

from mimo_pipes.checkpoint import generation as generation_module
from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.errors import ConfigError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.megatron import microbatches_from_samples
from mimo_pipes.megatron.checkpoint import (
    PIPELINE_FOLDER,
    TRACKER_FILE,
    commit_iteration,
    iteration_folder,
    latest_iteration,
    load_pipeline_state,
    pipeline_state_folder,
    save_pipeline_state,
)
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline

B, PER_ITERATION = 4, 3  # a global batch of 3 micro-batches of 4 samples; windows of 2 cross iterations
MEGATRON = {"global_batch_size": B * PER_ITERATION, "micro_batch_size": B, "data_parallel_size": 1}


def config(seed: int = 5) -> PipelineConfig:
    return PipelineConfig(components=("language=dp=1",), micro_batch_size=B, global_batch_size=B * 2, seq_length=4096, seed=seed,
                          num_workers=1, reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_window_size=2,
                                                               reorder_across_microbatches=True))


def loader(settings: PipelineConfig | None = None):
    return pipeline(SyntheticProcessedDataset(96, seed=1), settings or config(), RankLayout(0, 1, 1), map_fn=None,
                    image_token_id=IMAGE_TOKEN_ID, pad_values={"input_ids": 0, "labels": -100})


def take(graph, count: int) -> list:
    return [fingerprint(next(graph)) for _ in range(count)]


def train(checkpoint_dir: Path, iterations: int, save_at: tuple[int, ...], *, commit: bool = True) -> tuple[list, int]:
    """Megatron's loop on one rank: per iteration, PER_ITERATION micro-batches and the global batch added to
    consumed_train_samples; at each of ``save_at`` the pipeline's state into the iteration folder, then (``commit``)
    the tracker, as Megatron writes it after the folder. Returns the micro-batches taken and the samples consumed."""
    graph, taken, consumed_train_samples = loader(), [], 0
    try:
        for iteration in range(1, iterations + 1):
            taken += take(graph, PER_ITERATION)
            consumed_train_samples += B * PER_ITERATION
            if iteration in save_at:
                consumed = microbatches_from_samples(consumed_train_samples=consumed_train_samples, **MEGATRON)
                save_pipeline_state(checkpoint_dir, iteration, graph.state_dict(), config=config(), consumed_microbatches=consumed)
                if commit:
                    commit_iteration(checkpoint_dir, iteration)
    finally:
        graph.close()
    return taken, consumed_train_samples


@pytest.fixture(scope="module")
def reference() -> list:
    graph = loader()
    try:
        return take(graph, 5 * PER_ITERATION)
    finally:
        graph.close()


def resumed(checkpoint_dir: Path, count: int, **options) -> list:
    state = load_pipeline_state(checkpoint_dir, config=config(), **options)
    graph = loader()
    try:
        graph.load_state_dict(state)
        return take(graph, count)
    finally:
        graph.close()


def test_a_state_saved_in_an_iteration_folder_continues_the_stream(tmp_path, reference):
    taken, _ = train(tmp_path, 2, save_at=(1, 2))
    assert taken == reference[:6]
    assert latest_iteration(tmp_path) == 2 and (tmp_path / TRACKER_FILE).read_text() == "2"
    assert sorted(path.name for path in iteration_folder(tmp_path, 2).iterdir()) == [PIPELINE_FOLDER]
    assert (iteration_folder(tmp_path, 1) / PIPELINE_FOLDER / "manifest.json").is_file()  # iteration 1 keeps its own
    assert resumed(tmp_path, 9, consumed_microbatches=6) == reference[6:]  # at a window's start (6 % 2 == 0)
    assert resumed(tmp_path, 3, consumed_microbatches=3, iteration=1) == reference[3:6]  # inside a window (3 % 2 == 1)


def test_a_save_killed_while_writing_leaves_the_previous_iteration_whole(tmp_path, reference, monkeypatch):
    train(tmp_path, 1, save_at=(1,))
    real_write = generation_module._write_file

    def killed_half_way(path, data):
        real_write(path, data[: len(data) // 2])  # what a kill during the write leaves on disk
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(generation_module, "_write_file", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path, 2, save_at=(2,))
    monkeypatch.undo()
    assert latest_iteration(tmp_path) == 1
    assert resumed(tmp_path, 6) == reference[3:9]
    with pytest.raises(ConfigError, match=r"^--load: .*iter_0000002/mimo_pipes holds no saved state \(manifest.json missing\)"):
        load_pipeline_state(tmp_path, 2, config=config())


def test_a_job_killed_before_megatron_commits_resumes_from_the_committed_iteration(tmp_path, reference):
    train(tmp_path, 1, save_at=(1,))
    train(tmp_path, 2, save_at=(2,), commit=False)  # the pipeline's part written, Megatron's tracker not yet
    assert latest_iteration(tmp_path) == 1 and pipeline_state_folder(tmp_path, 2).is_dir()
    assert resumed(tmp_path, 6, consumed_microbatches=3) == reference[3:9]


def test_a_damaged_or_foreign_state_is_refused_naming_the_file(tmp_path):
    train(tmp_path, 1, save_at=(1,))
    folder = pipeline_state_folder(tmp_path, 1)
    with pytest.raises(ConfigError, match=r"^--load: .* was saved with seed 5, this run has 6"):
        load_pipeline_state(tmp_path, config=config(seed=6))
    with pytest.raises(ConfigError, match="saved after 3 micro-batches, the checkpoint's consumed samples make 6"):
        load_pipeline_state(tmp_path, config=config(), consumed_microbatches=6)
    rank_file = next(folder.glob("generation-*/rank0.json"))
    rank_file.write_bytes(rank_file.read_bytes()[:-5])
    with pytest.raises(ConfigError, match=r"^--load: .*rank0.json is \d+ bytes, the manifest says \d+: truncated"):
        load_pipeline_state(tmp_path, config=config())


def test_the_loader_must_stand_where_training_stands(tmp_path):
    graph = loader()
    try:
        take(graph, 4)  # a thread reading ahead of training holds one more micro-batch than the 3 consumed
        with pytest.raises(ConfigError, match="^--save: .*rank 0: --save: its loader has handed out 4 micro-batches, training stands at 3"):
            save_pipeline_state(tmp_path, 1, graph.state_dict(), config=config(), consumed_microbatches=3)
    finally:
        graph.close()
    assert not list(pipeline_state_folder(tmp_path, 1).glob("*"))  # nothing of the refused save stays


def test_the_tracker_as_megatron_writes_and_reads_it(tmp_path):
    assert latest_iteration(tmp_path) is None and load_pipeline_state(tmp_path, config=config()) is None
    (tmp_path / TRACKER_FILE).write_text("release")
    assert latest_iteration(tmp_path) is None
    (tmp_path / TRACKER_FILE).write_text("12")  # Megatron-LM writes the number alone
    assert latest_iteration(tmp_path) == 12
    (tmp_path / TRACKER_FILE).write_text("1")
    iteration_folder(tmp_path, 1).mkdir()  # an iteration saved without the pipeline's state
    with pytest.raises(ConfigError, match="iter_0000001 holds no pipeline state .*consumed_microbatches="):
        load_pipeline_state(tmp_path, config=config())
    (tmp_path / TRACKER_FILE).write_text("")
    with pytest.raises(ConfigError, match=f"^--load: .*{TRACKER_FILE} holds '', not an iteration number"):
        latest_iteration(tmp_path)
    commit_iteration(tmp_path, 7)
    assert latest_iteration(tmp_path) == 7 and [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []
    with pytest.raises(ConfigError, match="^iteration: must be an integer >= 0, got 7.0"):
        commit_iteration(tmp_path, 7.0)


def test_the_manifest_records_megatrons_position_and_the_layout(tmp_path):
    train(tmp_path, 2, save_at=(2,))
    manifest = json.loads((pipeline_state_folder(tmp_path, 2) / "manifest.json").read_text())
    assert manifest["consumed_microbatches"] == 6 and manifest["world_size"] == 1
    assert manifest["layout"] == ["language=tp=1,cp=1,pp=1,dp=1,etp=1,rank_offset=0"]
    assert set(manifest["files"]) == {"rank0.json"} and manifest["settings"]["seed"] == 5
