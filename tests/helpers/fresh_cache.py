"""An empty cache folder for one test (``MIMO_PIPES_CACHE``) that already holds the run's built-in processor.

What a test wants fresh is what it checks (S3 copies, cached counts); the processor folder is built the same on
every host (test_data checks that), and building it again costs about a second of CPU each time."""

from __future__ import annotations

from pathlib import Path

from mimo_pipes.data.embedded.builtin_processor import default_processor_path


def fresh_cache(folder: Path) -> Path:
    """``folder``, made, holding a link to the processor of the cache in use now (built there first if need be)."""
    processor = default_processor_path()
    folder.mkdir(parents=True)
    (folder / processor.name).symlink_to(processor, target_is_directory=True)
    return folder
