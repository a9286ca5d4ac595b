"""What a prepared Megatron-Energon dataset's ``.nv-meta/`` says (its splits, their shards in order and
each shard's sample count), read with one line naming the piece that is missing or wrong.

``energon prepare DIR`` writes ``.info.json`` (each shard's samples), ``split.yaml`` (which shards make
each split part: ``train``, ``val``, ``test``), the shards' ``.tar.idx`` indexes and ``index.sqlite``,
then asks for the sample type and writes ``dataset.yaml``. A folder of tar shards without ``.nv-meta/``
was never prepared; one without one of these files was not prepared to the end: both are told how to
prepare it. A split the dataset does not have is named with the ones it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mimo_pipes.errors import ConfigError

META = ".nv-meta"
SPLIT_FLAG = "--split-part"
PIECES = {
    ".info.json": "each shard's sample count",
    "split.yaml": "which shards make each split part",
    "dataset.yaml": "the sample type and field_map, written last",
}


def prepare_hint(folder: str | Path) -> str:
    return f"prepare it with Energon: energon prepare {folder}"


def unprepared(folder: Path) -> str | None:
    """Why ``folder`` (without ``.nv-meta/``) is an Energon dataset that was not prepared (it holds tar
    shards), or is the ``.nv-meta/`` folder of one; None otherwise."""
    if folder.name == META and folder.parent.joinpath(META).is_dir():
        return f"{str(folder)!r} is the {META}/ folder of an Energon dataset: pass the dataset's folder, {folder.parent}"
    if (folder / META).is_dir():
        return None
    tars = sorted(p.name for p in folder.glob("*.tar")) if folder.is_dir() else []
    if not tars:
        return None
    return (f"{str(folder)!r} holds {len(tars)} tar shard(s) ({tars[0]}{', ...' if len(tars) > 1 else ''}) but no {META}/ folder: "
            f"an Energon dataset that was not prepared; {prepare_hint(folder)}")


@dataclass(frozen=True)
class SplitMeta:
    """One split of a prepared dataset: its shards in ``split.yaml``'s order and their sample counts;
    ``info_names``: every shard ``.info.json`` counts, in its order (how the sqlite index numbers them)."""

    shards: list[str]
    counts: list[int]
    info_names: list[str]
    sample_excludes: frozenset[str]


def _missing_piece(folder: Path) -> str | None:
    meta = folder / META
    present = {
        ".info.json": (meta / ".info.json").is_file() or (meta / ".info.yaml").is_file(),
        "split.yaml": (meta / "split.yaml").is_file() or (meta / "split.json").is_file(),
        "dataset.yaml": (meta / "dataset.yaml").is_file(),
    }
    absent = [name for name, there in present.items() if not there]
    if not absent:
        return None
    what = "; ".join(f"{name} ({PIECES[name]})" for name in absent)
    return f"{str(folder)!r} is an Energon dataset that was not prepared to the end: {META}/ has no {what}; {prepare_hint(folder)}"


def read_yaml(path: Path, what: str) -> object:
    """``path`` parsed (YAML, or JSON); ConfigError naming the file, ``what`` it holds and where the text is
    wrong. Parsed here rather than by Energon's parser, which prints a failure to the terminal itself."""
    import yaml

    try:
        # read_bytes: a local Path and Energon's EPath (a file in object storage) both have it
        return yaml.load(path.read_bytes().decode("utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ConfigError("--dataset", f"cannot read {path} ({what}): {' '.join(str(error).split())[:300]}") from None


def split_parts(folder: Path) -> dict[str, list[str]]:
    """The split parts ``split.yaml`` (or ``split.json``) lists, each with its shard names (braces expanded)."""
    import braceexpand

    path = folder / META / ("split.yaml" if (folder / META / "split.yaml").is_file() else "split.json")
    raw = read_yaml(path, "its split_parts: each split's shards")
    parts = raw.get("split_parts") if isinstance(raw, dict) else None
    if not isinstance(parts, dict) or not all(isinstance(shards, (list, type(None))) for shards in parts.values()):
        raise ConfigError("--dataset", f"{path}: split_parts must map each split part to its list of shards; {prepare_hint(folder)}")
    return {str(part): [shard for entry in (shards or []) for shard in braceexpand.braceexpand(str(entry))] for part, shards in parts.items()}


def read_split(folder: Path, split: str) -> SplitMeta:
    """``split`` of the prepared dataset in ``folder``; ConfigError naming the missing piece, or the split
    (``--split-part``) and the ones the dataset has."""
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.metadata import WebdatasetMeta, get_info_shard_files

    missing = _missing_piece(folder)
    if missing is not None:
        raise ConfigError("--dataset", missing)
    parts = split_parts(folder)
    if split not in parts:
        raise ConfigError(SPLIT_FLAG, f"{str(folder)!r} has no {split!r} split: its {META}/split.yaml has {', '.join(sorted(parts)) or 'none'}")
    if not parts[split]:
        raise ConfigError(SPLIT_FLAG, f"{str(folder)!r}: its {split!r} split lists no shard in {META}/split.yaml")
    try:
        meta = WebdatasetMeta.from_config(EPath(folder), split_part=split)
        info_names = get_info_shard_files(EPath(folder))
    except KeyError as error:  # a shard split.yaml lists that .info.json does not count
        raise ConfigError("--dataset", f"{str(folder)!r}: {META}/split.yaml lists the shard {error.args[0]!r} in its {split!r} split, "
                                       f"but {META}/.info.json has no count for it; {prepare_hint(folder)}") from None
    except Exception as error:  # noqa: BLE001 - any other unreadable metadata
        raise ConfigError("--dataset", f"{str(folder)!r}: cannot read its {META}/ ({' '.join(str(error).split())[:300]}); "
                                       f"{prepare_hint(folder)}") from None
    return SplitMeta([shard.name for shard in meta.shards], [int(shard.count) for shard in meta.shards], list(info_names),
                     frozenset(meta.sample_excludes))
