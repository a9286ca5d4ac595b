"""The one line that describes a job: its modules, grid, batch, micro-batches and reordering mode (printed
when the job starts and above its summary). Light: no torch, so it can be printed at once."""

from __future__ import annotations

from mimo_pipes.config import PipelineConfig
from mimo_pipes.parallel.topology import Topology


def job_mode(config: PipelineConfig) -> str:
    reorder = config.reorder
    if reorder.intra_microbatch_reorder:
        mode = (
            f"reorder on (window {reorder.reorder_window_size}"
            f"{', across micro-batches' if reorder.reorder_across_microbatches else ''}, "
            f"overlap {'on' if reorder.overlap_intra_microbatch_reorder else 'off'})"
        )
    else:
        mode = "reorder off (enable with --scalable-dp --intra-microbatch-reorder)"
    if config.pack_sequences_in_batch:
        mode += f", sequence packing on (THD, pad multiple {config.pack_pad_multiple})"
    return mode


def headline(config: PipelineConfig, topology: Topology, start: int, end: int, command: str = "mimo-pipes run", mode: str | None = None) -> str:
    """``end``: the count of micro-batches consumed when the run stopped (start..end-1 were this run's);
    ``mode``: the reordering mode as said (default: :func:`job_mode`)."""
    modules = " + ".join(f"{m.name} dp={m.dp}" for m in topology.modules)
    return (
        f"{command}: {modules}, canonical grid {topology.grid_size}, micro-batch {config.micro_batch_size}, "
        f"{f'micro-batches {start}..{end - 1}' if end > start else 'no micro-batches'}, {mode or job_mode(config)}"
    )
