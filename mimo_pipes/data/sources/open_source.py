"""What ``--dataset`` names, opened as one source of conversation rows: a ``save_to_disk`` folder
(:mod:`~mimo_pipes.data.sources.saved_folder`), Parquet / JSON / JSON-lines files and globs (LLaVA annotation lists
included), both as memory-mapped Arrow through ``datasets``, or a prepared Megatron-Energon dataset or metadataset
(:mod:`~mimo_pipes.data.sources.energon_source`); and its rows read as the graph's reader reads them.

Image columns typed ``datasets.Image`` are left undecoded (``{"bytes", "path"}``): the per-sample
processor decodes them, on its worker threads, and names the row when one is broken.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from pathlib import Path

from mimo_pipes.data.cache import cache_root
from mimo_pipes.data.sources.energon_source import EnergonDataset, check_split, is_energon
from mimo_pipes.data.storage.s3_url import is_s3
from mimo_pipes.errors import ConfigError, json_error_text
from mimo_pipes.observe.third_party import quiet_datasets

BUILDERS = {".parquet": "parquet", ".json": "json", ".jsonl": "json"}
HINT = "pass a save_to_disk folder, .parquet / .json / .jsonl files or a glob of them, or a prepared Energon dataset or metadataset .yaml"


def data_files(spec: str) -> tuple[str, list[str]]:
    """The ``datasets`` builder and the sorted files a file path or glob names (``~`` expanded)."""
    spec = os.path.expanduser(spec)
    files = sorted(glob.glob(spec)) if glob.has_magic(spec) else ([spec] if Path(spec).is_file() else [])
    if not files:
        raise ConfigError("--dataset", f"{spec!r} matches no file; {HINT}")
    kinds = {Path(f).suffix.lower() for f in files}
    builders = {BUILDERS.get(k) for k in kinds}
    if None in builders or len(builders) != 1:
        raise ConfigError("--dataset", f"{spec!r} holds files of kind {sorted(kinds)}; {HINT} (one kind at a time)")
    return builders.pop(), files


def dataset_folder(spec: str | Path) -> Path | str:
    """The folder that holds ``spec``'s rows: a ``save_to_disk`` folder itself, a file's folder, or the
    deepest folder of a glob above its first wildcard (an ``s3://`` URL for data in S3). Image paths in the
    rows resolve inside it when no ``--image-folder`` is given."""
    if is_s3(spec):
        from mimo_pipes.data.sources.s3_source import is_file_spec
        from mimo_pipes.data.storage.s3_url import parent

        return parent(str(spec)) if is_file_spec(str(spec)) else str(spec).rstrip("/")
    path = Path(spec).expanduser()
    if glob.has_magic(str(path)):
        fixed = [part for part in path.parts[: next(k for k, part in enumerate(path.parts) if glob.has_magic(part))]]
        return Path(*fixed) if fixed else Path(".")
    return path if path.is_dir() else path.parent


def check_source(spec: str | Path, split: str = "train") -> None:
    """Fail with ``ConfigError`` unless ``spec`` names a readable source with a ``split`` part (``--dataset``,
    or ``--split-part``). An Energon dataset's ``dataset.yaml`` is checked against its first samples."""
    from mimo_pipes.data.sources.saved_folder import check_dataset_path

    if is_energon(spec):
        from mimo_pipes.data.sources.energon_checks import check_samples

        source = open_energon(spec, split)
        for part in getattr(source, "parts", [source]):
            check_samples(part)
        return
    check_split(spec, split)
    if is_s3(spec):
        from mimo_pipes.data.sources.s3_source import check_s3_source

        check_s3_source(str(spec))
    elif Path(spec).expanduser().is_dir():
        check_dataset_path(spec)
    else:
        data_files(str(spec))


def report_problems(dataset, *, skip_bad: bool, log) -> None:
    """A source's rows that cannot be read, found before any rank starts (an Energon dataset's shards that are
    missing, cut or without their index): refused without ``skip_bad``, else each said once with ``log``."""
    from mimo_pipes.data.sources.energon_blend import EnergonBlend

    if not isinstance(dataset, (EnergonDataset, EnergonBlend)):
        return
    from mimo_pipes.data.sources.energon_checks import refuse_source_problems, source_problems

    problems, _ = source_problems(dataset)
    if not skip_bad:
        refuse_source_problems(problems, str(dataset.path))
    for problem in problems:
        log(f"--dataset: {problem.text}: {problem.kind}: {problem.reason}; its rows are replaced (--skip-bad-samples)")


def open_source(spec: str | Path, split: str = "train", *, arrow_cache: Path | None = None):
    """``spec`` as a :class:`datasets.Dataset` with a conversation column, images left undecoded (an
    Energon dataset as :func:`open_energon` opens it, its ``split`` part: ``--split-part``). ``arrow_cache``: where
    JSON files are converted to Arrow (default: the cache's ``datasets`` folder)."""
    if is_energon(spec):  # before datasets is imported: an Energon source does without it
        return open_energon(spec, split)
    check_split(spec, split)
    if is_s3(spec):
        from mimo_pipes.data.sources.s3_source import open_s3_source

        return _check_rows(spec, open_s3_source(str(spec), open_source))
    import datasets

    from mimo_pipes.data.sources.saved_folder import open_dataset

    if Path(spec).expanduser().is_dir():
        ds = open_dataset(spec, split)
    else:
        builder, files = data_files(str(spec))
        try:
            with quiet_datasets():  # no "Generating train split" bar on every rank
                ds = datasets.load_dataset(builder, data_files=files, split="train", cache_dir=str(arrow_cache or cache_root() / "datasets"))
        except Exception as e:  # noqa: BLE001 - any parsing failure is a bad --dataset
            raise ConfigError("--dataset", f"cannot read {str(spec)!r} as {builder}: {why_unreadable(builder, files, e)}") from e
    return _images_undecoded(_check_rows(spec, ds))


def _check_rows(spec: str | Path, ds):
    """``ds`` when it has a conversation column and rows; ConfigError naming ``spec`` otherwise."""
    columns = set(ds.column_names)
    if not (columns & {"messages", "conversations"} or {"prompt", "response"} <= columns):
        raise ConfigError(
            "--dataset", f"{str(spec)!r} has none of the columns messages, conversations, or prompt and response "
            f"(has {', '.join(ds.column_names)})"
        )
    if len(ds) == 0:
        raise ConfigError("--dataset", f"{str(spec)!r} is empty")
    return ds


def open_energon(spec: str | Path, split: str = "train"):
    """An Energon dataset folder or metadataset YAML file as a map-style source of conversation rows."""
    from mimo_pipes.data.sources.energon_remote import is_metadataset_url

    remote = is_s3(spec) or str(spec).startswith("msc://")
    if (remote and not is_metadataset_url(str(spec))) or (not remote and Path(spec).expanduser().is_dir()):
        return EnergonDataset(spec, split)
    from mimo_pipes.data.sources.energon_blend import EnergonBlend

    return EnergonBlend(spec, split)


def read_rows(dataset, start: int, stop: int) -> list[dict]:
    """Rows ``start..stop-1`` of ``dataset`` as the graph's reader gets them from :func:`open_source`: every
    column decoded by its feature (a LLaVA ``image`` column stored as JSON, say) except images, which stay
    ``{"bytes", "path"}`` whatever the features say, so no pixel is decoded. A Hugging Face dataset is read
    as one batch (its selection kept); anything else indexed row by row."""
    if not (hasattr(dataset, "with_format") and hasattr(dataset, "features")):
        return [dataset[index] for index in range(start, stop)]
    features = encoded_image_features(dataset.features)
    columns = (features or dataset.features).decode_batch(dataset.with_format("arrow")[start:stop].to_pydict())
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def encoded_image_features(features):
    """``features`` with every image inside them left encoded; None when none decodes."""
    changed = features.copy()
    found = False
    for name, feature in features.items():
        undecoded = _undecoded(feature)
        if undecoded is not None:
            changed[name] = undecoded
            found = True
    return changed if found else None


def _images_undecoded(ds):
    """The same memory-mapped table under features whose images stay ``{"bytes", "path"}``: no data is
    copied (``cast_column`` would rewrite the table for a list of images)."""
    import copy

    import datasets

    features = encoded_image_features(ds.features)
    if features is None:
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


# ----------------------------------------------------------------------------------------------------
# Why files could not be read: found only after ``datasets`` failed, so a good source is read once


def why_unreadable(builder: str, files: list[str], error: BaseException) -> str:
    """The first thing wrong with ``files``, with its place (file and line, or both files and the column),
    else the innermost cause of ``error`` (``datasets`` hides it behind a generic message)."""
    for problem in (_json_problems(files) if builder == "json" else _parquet_problems(files)):
        return problem
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _json_problems(files: list[str]) -> Iterator[str]:
    """An empty file, or the first malformed line (a ``.json`` file read whole first, as one value)."""
    for name in files:
        with open(name, "rb") as handle:
            if not any(line.strip() for line in handle):
                yield f"{name} holds no rows (the file is empty)"
                return
        if name.lower().endswith(".json"):
            try:
                with open(name, encoding="utf-8") as handle:
                    json.load(handle)
                continue
            except json.JSONDecodeError as e:
                if e.msg != "Extra data":  # more than one value: JSON lines in a .json file
                    yield f"{name} line {e.lineno}: invalid JSON: {json_error_text(e, line=False)}"
                    return
            except UnicodeDecodeError as e:
                yield f"{name}: not UTF-8 text ({e.reason} at byte {e.start})"
                return
        with open(name, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                try:
                    json.loads(raw.rstrip(b"\r\n"))  # an error at the end named at its column, not at a line 2
                except UnicodeDecodeError:
                    yield f"{name} line {number}: not UTF-8 text"
                    return
                except json.JSONDecodeError as e:
                    yield f"{name} line {number}: invalid JSON: {json_error_text(e, line=False)}"
                    return


def _parquet_problems(files: list[str]) -> Iterator[str]:
    """A file that is not Parquet, or a column typed differently in two files (schemas only: no data read)."""
    import pyarrow.parquet as pq

    first: tuple[str, dict] | None = None
    for name in files:
        try:
            schema = pq.read_schema(name)
        except Exception as e:  # noqa: BLE001 - an unreadable part names itself
            yield f"{name} cannot be read as Parquet: {' '.join(str(e).split())}"
            return
        types = {field.name: field.type for field in schema}
        if first is None:
            first = (name, types)
            continue
        for column, kind in types.items():
            if column in first[1] and first[1][column] != kind:
                yield f"column {column!r} is {kind} in {name} but {first[1][column]} in {first[0]}: every part needs the same column types"
                return
