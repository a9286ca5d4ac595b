"""What `mimo-pipes run` prints on the pool's Gloo ranks: each warning once for the whole job (counted in
rank 0's summary, never per rank or per sample), and exchange metrics lines only from the process that
draws the progress bar, the other modules' last line handed to it for the end."""

from __future__ import annotations

from scenarios_jobs import run_job

from mimo_pipes.data.embedded.builtin_dataset import default_dataset_path
from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.data.sources.saved_folder import open_dataset

SAMPLES, BATCH, STEPS, SEQ = 64, 8, 8, 1300
ARGS = ["--component", "language=dp=2", "--component", "images=dp=2,rank_offset=2", "--scalable-dp", "--intra-microbatch-reorder",
        "--embedded-samples", str(SAMPLES), "--micro-batch-size", str(BATCH), "--steps", str(STEPS), "--seq-length", str(SEQ),
        "--log-interval", "1"]  # the progress bar on: metrics lines every window


def _truncated_rows() -> list[int]:
    """Rows longer than --seq-length, from the processor run with room to spare."""
    dataset, processor = open_dataset(default_dataset_path(SAMPLES, seed=0)), load_processor(default_processor_path(), 4096)
    return [i for i in range(len(dataset)) if len(processor({**dataset[i], "sample_id": i})["input_ids"]) > SEQ]


def test_truncation_is_one_line_for_the_job_and_metrics_keep_the_bar_whole(gloo_pool):
    outcomes = [outcome for outcome in gloo_pool.run(run_job, ARGS, timeout=300) if outcome is not None]
    assert len(outcomes) == 4
    truncated = _truncated_rows()
    assert len(truncated) > 3  # every rank truncates some: modules and ranks see the same rows
    rank0 = outcomes[0]
    lines = [line for line in rank0["stdout"].splitlines() if line.startswith("warnings:")]
    assert lines == [f"warnings: {len(truncated)} samples truncated to --seq-length (later turns first, then the prompt's start and the reply's end; "
        "every image placeholder kept; "
                     f"first: dataset row {truncated[0]})"]
    assert all(outcome["result"].warnings[0].count == len(truncated) for outcome in outcomes)  # every rank has the merge
    assert not any("truncated" in outcome["stderr"] for outcome in outcomes)  # nothing per sample, on any rank
    # Metrics: every window's language line on rank 0 (through the bar's writer), the images module's last one
    # handed to rank 0 and printed once at the end; no line from any other process.
    assert rank0["stderr"].count("exchange metrics: language:") == STEPS
    assert rank0["stderr"].count("exchange metrics: images:") == 1
    assert f"exchange metrics: images: {STEPS} windows, {STEPS} micro-batches" in rank0["stderr"]
    assert all("exchange metrics" not in outcome["stderr"] for outcome in outcomes[1:])
