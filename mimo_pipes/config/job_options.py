"""What ``mimo-pipes run`` and ``train`` do besides building the graph: the command line's own options, apart
from the pipeline's configuration (:mod:`mimo_pipes.config`)."""

from __future__ import annotations

from dataclasses import dataclass

from mimo_pipes.config.pipeline import take_counts


@dataclass
class JobOptions:
    """What ``mimo-pipes run`` does besides building the graph."""

    steps: int = 32
    recipe: str = "mimo_pipes_recipes.vlm_sft"
    dump_assignments: str | None = None
    stop_after: int | None = None
    save_state: str | None = None
    resume: str | None = None
    progress: bool = True
    # Exchange metrics (mimo_pipes.observe.metrics), written by DP rank 0 of each module.
    tensorboard: str | None = None  # event files under DIR/<module>/
    log_interval: int = 20  # a metrics line every N windows and at the end (0: only at the end)
    summary_json: str | None = None  # `run` writes its summary here as JSON (rank 0)

    COUNTS = {"steps": None, "stop_after": None, "log_interval": None}  # integers; their ranges: cli/job/checks.py

    def __post_init__(self) -> None:
        take_counts(self, self.COUNTS)


@dataclass
class TrainOptions(JobOptions):
    """What ``mimo-pipes train`` adds to run's options: the recipe trains instead of only reading."""

    recipe: str = "mimo_pipes_recipes.tiny_mimo_train"
    lr: float = 0.1
    vision_tower: str = "tiny"
