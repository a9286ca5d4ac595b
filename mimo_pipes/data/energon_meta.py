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
    """Why ``folder`` (without ``.nv-meta/``) is an Energon dataset that was not prepared: it holds tar
    shards; None when it holds none."""
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


def split_parts(folder: Path) -> dict[str, list[str]]:
    """The split parts ``split.yaml`` (or ``split.json``) lists, each with its shard names (braces expanded)."""
    import braceexpand
    from megatron.energon.epathlib import EPath
    from megatron.energon.eyaml import load_yaml_json

    meta = folder / META
    name = "split.yaml" if (meta / "split.yaml").is_file() else "split.json"
    try:
        raw = load_yaml_json(EPath(meta / name))
        parts = raw["split_parts"]
        return {str(part): [shard for entry in (shards or []) for shard in braceexpand.braceexpand(str(entry))]
                for part, shards in parts.items()}
    except Exception as error:  # noqa: BLE001 - a file Energon's prepare did not write
        raise ConfigError("--dataset", f"cannot read {meta / name} (its split_parts: each split's shards): "
                                       f"{' '.join(str(error).split())[:200] or type(error).__name__}") from None


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
