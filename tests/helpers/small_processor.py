"""The embedded processor with a smaller pixel budget, for whole training jobs whose checks do not depend on image
size (losses equal under reordering, resume and another layout): every image resized to at most
``SMALL_MAX_PIXELS``, so the tiny vision tower attends over a few hundred patches an image instead of up to five
thousand (its attention and gradients are most of a training step's CPU time)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mimo_pipes.data.cache import build_atomically, cache_root
from mimo_pipes.data.embedded.builtin_processor import PROCESSOR_VERSION, default_processor_path

SMALL_MAX_PIXELS = 320 * 28 * 28
"""At most 320 image tokens an image (28 x 28 pixels each after the 2 x 2 merge; the embedded images have up to 1280):
the samples still differ in size, so that reordering moves them."""


def small_processor_path() -> str:
    """The folder (built once, atomically, beside the embedded processor in the cache)."""
    return str(build_atomically(cache_root() / f"processor-{PROCESSOR_VERSION}-max-pixels-{SMALL_MAX_PIXELS}", _build))


def _build(folder: Path) -> None:
    source = default_processor_path()
    for path in source.iterdir():
        shutil.copy(path, folder / path.name)
    config_path = folder / "preprocessor_config.json"
    config = json.loads(config_path.read_text())
    config["size"]["longest_edge"] = SMALL_MAX_PIXELS
    config_path.write_text(json.dumps(config, indent=2))
