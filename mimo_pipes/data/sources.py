"""Dataset sources behind ``--dataset``: a ``save_to_disk`` folder, or Parquet / JSON / JSON-lines files
and globs (LLaVA annotation lists included), all opened as memory-mapped Arrow through ``datasets``.

Image columns typed ``datasets.Image`` are left undecoded (``{"bytes", "path"}``): the per-sample
processor decodes them, on its worker threads, and names the row when one is broken.
"""

from __future__ import annotations

import glob
from pathlib import Path

from mimo_pipes.data.cache import cache_root
from mimo_pipes.errors import ConfigError

BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json"}
HINT = "pass a save_to_disk folder, or .parquet / .json / .jsonl files or a glob of them"


def data_files(spec: str) -> tuple[str, list[str]]:
    """The ``datasets`` builder and the sorted files a file path or glob names."""
    files = sorted(glob.glob(spec)) if glob.has_magic(spec) else ([spec] if Path(spec).is_file() else [])
    if not files:
        raise ConfigError("--dataset", f"{spec!r} matches no file; {HINT}")
    kinds = {Path(f).suffix.lower() for f in files}
    builders = {BUILDERS.get(k) for k in kinds}
    if None in builders or len(builders) != 1:
        raise ConfigError("--dataset", f"{spec!r} holds files of kind {sorted(kinds)}; {HINT} (one kind at a time)")
    return builders.pop(), files


def check_source(spec: str | Path) -> None:
    """Fail with ``ConfigError('--dataset', ...)`` unless ``spec`` names a readable source."""
    from mimo_pipes.data.dataset import check_dataset_path

    if Path(spec).expanduser().is_dir():
        check_dataset_path(spec)
    else:
        data_files(str(spec))


def open_source(spec: str | Path, split: str = "train"):
    """``spec`` as a :class:`datasets.Dataset` with a conversation column, images left undecoded."""
    import datasets

    from mimo_pipes.data.dataset import open_dataset

    if Path(spec).expanduser().is_dir():
        ds = open_dataset(spec, split)
    else:
        builder, files = data_files(str(spec))
        try:
            ds = datasets.load_dataset(builder, data_files=files, split="train", cache_dir=str(cache_root() / "datasets"))
        except Exception as e:  # noqa: BLE001 - any parsing failure is a bad --dataset
            raise ConfigError("--dataset", f"cannot read {str(spec)!r} as {builder}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    columns = set(ds.column_names)
    if not (columns & {"messages", "conversations"} or {"prompt", "response"} <= columns):
        raise ConfigError(
            "--dataset", f"{str(spec)!r} has none of the columns messages, conversations, or prompt and response "
            f"(has {', '.join(ds.column_names)})"
        )
    if len(ds) == 0:
        raise ConfigError("--dataset", f"{str(spec)!r} is empty")
    return _images_undecoded(ds)


def _images_undecoded(ds):
    """The same memory-mapped table under features whose images stay ``{"bytes", "path"}``: no data is
    copied (``cast_column`` would rewrite the table for a list of images)."""
    import copy

    import datasets

    features = ds.features.copy()
    changed = False
    for name, feature in ds.features.items():
        undecoded = _undecoded(feature)
        if undecoded is not None:
            features[name] = undecoded
            changed = True
    if not changed:
        return ds
    if ds._indices is not None:  # a selected view: keep it (save_to_disk folders have none)
        ds = ds.flatten_indices()
    info = copy.deepcopy(ds.info)
    info.features = features
    return datasets.Dataset(ds.data, info=info, split=ds.split)


def _undecoded(feature):
    """``feature`` with every image inside it (lists of images, lists of lists: video frames) left
    encoded; None when it holds no image to decode."""
    import dataclasses

    import datasets

    if isinstance(feature, datasets.Image):
        return datasets.Image(decode=False) if feature.decode else None
    inner = getattr(feature, "feature", None)
    undecoded = _undecoded(inner) if inner is not None else None
    if undecoded is None:
        return None
    return dataclasses.replace(feature, feature=undecoded) if dataclasses.is_dataclass(feature) else type(feature)(undecoded)
