"""The calibration sweep: which forwards ``mimo-pipes calibrate`` times, and its defaults per device.

Torch-free (the parser of every command is built, and it shows these defaults); the timing itself is
in :mod:`mimo_pipes.time_model.calibrate`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Sweep:
    """What a calibration times: image sides in patches, images per forward, forwards mixing sizes, the
    largest forward (patches), and how often each forward runs (untimed warm-up runs, timed rounds)."""

    sides: tuple[int, ...]
    counts: tuple[int, ...]
    mixes: int
    max_patches: int
    repeats: int
    warmup: int


# A GPU sweep covers the images training sees (up to 128 x 128 patches, forwards of up to 65,536
# patches, which fit in memory on any GPU that can train the tower). On a CPU the attention over one
# image grows with its patches squared: one 128 x 128 image takes seconds in the tiny tower, and a round
# of the GPU sweep was reported unfinished after 17 minutes on 2 cores. The CPU sweep stops at 64 x 64
# patches and 16,384 patches per forward and still spans the floor, the per-image cost (16 small images)
# and the quadratic term (1 x 4,096 patches against 4 x 1,024); its forwards are short, so noisier, hence
# 9 rounds. The tiny tower's whole CPU calibration took 90 s on 2 busy cores (docs/balancing.md).
SWEEPS: dict[str, Sweep] = {
    "cuda": Sweep(sides=(8, 16, 32, 48, 64, 96, 128), counts=(1, 4, 16, 64), mixes=12, max_patches=65_536, repeats=5, warmup=2),
    "cpu": Sweep(sides=(8, 16, 32, 48, 64), counts=(1, 4, 16), mixes=8, max_patches=16_384, repeats=9, warmup=1),
}


def round_side(side: int, merge_size: int) -> int:
    """An image side rounded up to a multiple of the merge size (the processor makes no other)."""
    return -(-int(side) // merge_size) * merge_size


def uniform_shapes(sides: Sequence[int], counts: Sequence[int], merge_size: int, max_patches: int) -> list[tuple[int, int]]:
    """(side, count) shapes of the sweep: sides rounded up to the merge size, forwards above ``max_patches`` left out."""
    shapes = []
    for side in sides:
        side = round_side(side, merge_size)
        for count in counts:
            if side * side * count <= max_patches and (side, count) not in shapes:
                shapes.append((side, int(count)))
    if not shapes:
        raise ValueError(f"no forward of the sweep fits in {max_patches} patches")
    return shapes


def mixed_shapes(sides: Sequence[int], merge_size: int, number: int, max_patches: int, seed: int = 0,
                 max_images: int = 8) -> list[tuple[int, ...]]:
    """``number`` forwards of 2..``max_images`` images of different sides drawn from ``sides`` (seeded).

    Real forwards mix sizes; the uniform sweep alone leaves the fit blind to how a small image beside a
    large one costs."""
    rounded = sorted({round_side(side, merge_size) for side in sides})
    if len(rounded) < 2 or number <= 0:
        return []
    rng = random.Random(seed)
    shapes: list[tuple[int, ...]] = []
    for _ in range(100 * number):
        if len(shapes) == number:
            break
        chosen = tuple(sorted((rng.choice(rounded) for _ in range(rng.randint(2, max_images))), reverse=True))
        if len(set(chosen)) > 1 and sum(s * s for s in chosen) <= max_patches and chosen not in shapes:
            shapes.append(chosen)
    return shapes


def forward_shapes(sweep: Sweep, merge_size: int, seed: int = 0) -> list[tuple[int, ...]]:
    """Every forward of a calibration, as the side of each of its images: the floor (one image of merge x
    merge patches) first, then the uniform shapes, then the mixes."""
    shapes: list[tuple[int, ...]] = [(merge_size,)]
    shapes += [(side,) * count for side, count in uniform_shapes(sweep.sides, sweep.counts, merge_size, sweep.max_patches)]
    shapes += mixed_shapes(sweep.sides, merge_size, sweep.mixes, sweep.max_patches, seed)
    return shapes
