"""Test-side helper: a state folder as ``--save-state`` writes it (one committed generation), with the
settings of a given configuration and empty loader states, for the checks a resume makes before any rank."""

from __future__ import annotations

from mimo_pipes.checkpoint import (
    commit_generation,
    encode_loader_state,
    loader_file,
    model_file,
    new_generation_id,
    write_rank_files,
)
from mimo_pipes.cli.job.resume_checks import layout_specs, resume_settings
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.job_options import JobOptions


def save_job(directory, config: PipelineConfig, options: JobOptions | None = None, *, world_size: int = 4, consumed: int = 3,
             model_files: bool = False) -> None:
    """A committed generation of ``world_size`` ranks saved after ``consumed`` micro-batches (``model_files``:
    with each rank's ``rank{r}.pt``, as ``mimo-pipes train`` saves, holding nothing)."""
    generation = new_generation_id()
    files = {}
    for rank in range(world_size):
        own = {loader_file(rank): encode_loader_state(generation, rank, {})}
        if model_files:
            own[model_file(rank)] = b""
        files.update(write_rank_files(directory, generation, own))
    commit_generation(directory, generation, consumed=consumed, world_size=world_size, layout=layout_specs(config),
                      settings=resume_settings(config, options or JobOptions()), files=files)
