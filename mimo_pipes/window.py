"""The unit the exchange works on: W consecutive micro-batches of one rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mimo_pipes.sample import Sample


@dataclass
class Window:
    """This rank's samples for global micro-batches ``first_step .. first_step + len(microbatches) - 1``.

    ``microbatches[m]`` lists the rank's samples of step ``first_step + m`` in canonical order; once
    ``collated``, it is instead that step's collated micro-batch (a dict of batched tensors).
    """

    first_step: int
    microbatches: list[list[Sample]] | list[dict[str, Any]]
    collated: bool = False
