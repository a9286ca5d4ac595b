"""A folder written by ``datasets``' ``save_to_disk`` as a ``--dataset`` source: checked, then opened as one split."""

from __future__ import annotations

from pathlib import Path

from mimo_pipes.data.paths import existing_folder
from mimo_pipes.data.sources.energon_meta import unprepared
from mimo_pipes.errors import ConfigError
from mimo_pipes.observe.third_party import quiet_datasets

REQUIRED_COLUMNS: tuple[str, ...] = ()
"""Columns every dataset must have; the conversation columns are checked by :func:`~mimo_pipes.data.sources.open_source.open_source`."""


def check_dataset_path(path: str | Path) -> Path:
    """Fail with ``ConfigError('--dataset', ...)`` unless ``path`` is a folder written by ``save_to_disk``."""
    hint = "pass a folder written by datasets' save_to_disk, or .parquet / .json / .jsonl files or a glob of them"
    p = existing_folder(path, "--dataset", hint)
    is_dataset = (p / "dataset_info.json").is_file() and (p / "state.json").is_file()
    is_dict = (p / "dataset_dict.json").is_file()
    if not (is_dataset or is_dict):
        raise ConfigError("--dataset", unprepared(p) or f"{str(path)!r} was not written by save_to_disk; {hint}")
    return p


def open_dataset(path: str | Path, split: str = "train"):
    """Open a ``save_to_disk`` folder as a :class:`datasets.Dataset` and check its columns.

    A ``DatasetDict`` folder yields ``split`` (or its only split).
    """
    import datasets

    p = check_dataset_path(path)
    try:
        with quiet_datasets():
            ds = datasets.load_from_disk(str(p))
    except Exception as e:  # noqa: BLE001 - any loading failure is a bad --dataset
        raise ConfigError("--dataset", f"cannot load {str(path)!r}: {e}") from e
    if isinstance(ds, datasets.DatasetDict):
        if split in ds:
            ds = ds[split]
        elif len(ds) == 1:
            ds = next(iter(ds.values()))
        else:
            raise ConfigError("--dataset", f"{str(path)!r} has splits {sorted(ds)} but no {split!r} split")
    missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
    if missing:
        raise ConfigError(
            "--dataset", f"{str(path)!r} lacks the column(s) {', '.join(missing)} (has {', '.join(ds.column_names)})"
        )
    if len(ds) == 0:
        raise ConfigError("--dataset", f"{str(path)!r} is empty")
    return ds
