"""An Energon metadataset (a YAML file blending prepared datasets) as one map-style source with one global
order, the same in every process.

The rule. Part ``i`` has ``n_i`` samples (its split part, read as
:class:`~mimo_pipes.data.sources.energon_source.EnergonDataset` reads it) and contributes ``c_i`` items to one pass
over the blend:

* ``blend`` with weights ``w_i``: ``c_i = ceil(s * w_i)`` with ``s = max_i(n_i / w_i)`` (exact fractions of
  the weights as written), so the part with the largest ``n_i / w_i`` contributes each of its samples once,
  every other part at least each of its samples once (repeated), and the parts' shares of a pass follow
  their weights. A part of weight 0 contributes nothing.
* ``blend_epochized`` with ``repetitions`` ``r_i``: ``c_i = ceil(r_i * n_i)``.

Item ``j`` of part ``i`` (``0 <= j < c_i``) is that part's sample ``j mod n_i`` and sits at ``(2j + 1) /
(2 c_i)`` of the pass; the pass lists all items by that position, a tie by the parts' order in the file.
So each part is spread evenly over the pass, and blend sample ``k`` is found without listing the pass.
A nested metadataset's weights are normalised to sum to 1 and multiplied by its own weight, as Energon
does. Joins, subsets and other dataset or split configs than ``dataset.yaml`` / ``split.yaml`` are refused.
An error names the metadataset file, the entry (``splits.train.blend[1] (path vqa)``, nested files
chained) and what is missing.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

from mimo_pipes.data import bad_rows
from mimo_pipes.data.sources.energon_meta import META, read_yaml, unprepared
from mimo_pipes.data.sources.energon_source import EnergonDataset, energon, is_energon
from mimo_pipes.errors import ConfigError

T = TypeVar("T")


def weighted_counts(sizes: list[int], weights: list[Fraction]) -> list[int]:
    """Each part's items in one pass of a weighted blend (see the module's rule)."""
    used = [(n, w) for n, w in zip(sizes, weights) if w > 0]
    if not used:
        raise ValueError("every weight is 0")
    scale = max(Fraction(n) / w for n, w in used)
    return [math.ceil(scale * w) if w > 0 else 0 for w in weights]


def repeated_counts(sizes: list[int], repetitions: list[Fraction]) -> list[int]:
    return [math.ceil(r * n) for n, r in zip(sizes, repetitions)]


class BlendOrder:
    """Blend item ``k`` -> (part, item of that part), for parts of ``counts`` items spread evenly."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = list(counts)
        self.total = sum(self.counts)

    def locate(self, k: int) -> tuple[int, int]:
        if not 0 <= k < self.total:
            raise IndexError(f"item {k} of a blend of {self.total}")
        parts = len(self.counts)
        # Items placed before x = (2k - parts) / (2 total) number at most k (each part's count at x is within
        # 1/2 of x * c_i): start there, then walk the items in order.
        a, b = max(0, 2 * k - parts), 2 * self.total
        heads = [min(c, max(0, (2 * c * a + b - 1) // (2 * b))) for c in self.counts]
        before = sum(heads)
        heap = [(Fraction(2 * j + 1, 2 * c), i) for i, (j, c) in enumerate(zip(heads, self.counts)) if j < c]
        heapq.heapify(heap)
        while True:
            _, part = heapq.heappop(heap)
            if before == k:
                return part, heads[part]
            before += 1
            heads[part] += 1
            if heads[part] < self.counts[part]:
                heapq.heappush(heap, (Fraction(2 * heads[part] + 1, 2 * self.counts[part]), part))


class EnergonBlend:
    """A metadataset's ``split``: ``len`` (one pass) and ``blend[k]`` -> the row of blend sample ``k``."""

    def __init__(self, path: str | Path, split: str = "train") -> None:
        from mimo_pipes.data.sources.energon_remote import epath, is_remote

        # A metadataset in object storage is read through Energon's storage layer (an EPath), as are the datasets it names.
        self.path = epath(str(path)) if is_remote(str(path)) else Path(path).expanduser()
        leaves = _leaves(self.path, split)
        self.parts = [_part(leaf) for leaf in leaves]
        sizes = [len(part) for part in self.parts]
        modes = {leaf.share[0] for leaf in leaves}
        if len(modes) > 1:
            raise ConfigError("--dataset", f"{str(path)!r} mixes blend weights and blend_epochized repetitions")
        factors = [leaf.share[1] for leaf in leaves]
        counts = repeated_counts(sizes, factors) if modes == {"repetitions"} else weighted_counts(sizes, factors)
        self.order = BlendOrder(counts)
        self.names = [str(leaf.folder) for leaf in leaves]
        self.entries = [leaf.entry for leaf in leaves]
        if len(self) == 0:
            raise ConfigError("--dataset", f"{str(path)!r} blends no samples")

    def __len__(self) -> int:
        return self.order.total

    def locate(self, index: int) -> tuple[int, int]:
        """(part, sample of that part) of blend sample ``index``."""
        part, item = self.order.locate(int(index))
        return part, item % len(self.parts[part])

    def __getitem__(self, index: int) -> dict:
        part, sample = self.locate(index)
        row = self.parts[part][sample]
        fault = row.get(bad_rows.ROW_FAULT)
        if fault is not None:  # named by its dataset too: two parts may have shards of one name
            row = {bad_rows.ROW_FAULT: {**fault, "reason": f"{self.names[part]}: {fault['reason']}"}}
        return row

    def places(self, rows: list[int]) -> dict[int, tuple[tuple[int, ...], str]]:
        found = {}
        for row in rows:
            part, sample = self.locate(row)
            (order, text) = self.parts[part].places([sample])[sample]
            found[row] = ((part, *order, row), f"{self.names[part]}: {text.rsplit(' (dataset row', 1)[0]} (dataset row {row})")
        return found

    def close(self) -> None:
        for part in self.parts:
            part.close()


def _part(leaf: Leaf) -> EnergonDataset:
    """The dataset a leaf names; its ConfigError said as the metadataset entry's."""
    try:
        return EnergonDataset(leaf.folder, split=leaf.split)
    except ConfigError as error:
        raise ConfigError("--dataset", f"{leaf.entry}: {str(error).removeprefix(error.setting + ': ')}") from None


@dataclass(frozen=True)
class Leaf:
    """One dataset a metadataset blends: its folder, split part, (mode, weight or repetitions), and where the
    metadataset names it (``blend.yaml: splits.train.blend[1] (path vqa)``, nested files chained)."""

    folder: Path | str  # a URL (msc://...) for a dataset in object storage
    split: str
    share: tuple[str, Fraction]
    entry: str


def _request(path: Any, call: Callable[[], T]) -> T:
    """``call()``, which reads ``path``; tried as the ``MIMO_PIPES_S3_*`` settings say where ``path`` is in object
    storage (an EPath: Energon's own requests, which the library's client of the store does not retry)."""
    if isinstance(path, Path):
        return call()
    from mimo_pipes.data.sources.energon_remote import retried

    return retried(call)


def _leaves(path: Path, split: str, scale: Fraction = Fraction(1), within: str = "") -> list[Leaf]:
    """Every dataset the metadataset ``path`` blends in its ``split``; ConfigError naming the metadataset
    file, the entry and what is missing."""
    energon()
    from megatron.energon.metadataset.loader import load_dataset

    where = f"{within}{path}"
    if path.parent.name == META:  # a file of a prepared dataset's metadata, not a metadataset
        raise ConfigError("--dataset", f"{where} is a file of an Energon dataset's {META}/: pass the dataset's folder, {path.parent.parent}")
    tree = _request(path, lambda: read_yaml(path, "a metadataset"))
    if not isinstance(tree, dict) or "splits" not in tree:
        raise ConfigError("--dataset", f"{where} is not an Energon metadataset: it has no splits (a MetadatasetV2 maps each split "
                                       "part to a blend or a dataset path)")
    try:
        loaded = _request(path, lambda: load_dataset(str(path)))
    except FileNotFoundError as error:  # Energon names the path alone: say which entry names it, and what it is
        missing = Path(str(error.filename or error.args[-1]))
        entry = _entry_naming(path, missing) or "an entry"
        if missing.is_dir():
            why = unprepared(missing) or f"{missing} is not a prepared Energon dataset (no .nv-meta/)"
            raise ConfigError("--dataset", f"{where}: {entry}: {why}") from None
        raise ConfigError("--dataset", f"{where}: {entry} names {missing}, which does not exist") from None
    except Exception as error:  # noqa: BLE001 - Energon's parser names what it could not read
        raise ConfigError("--dataset", f"cannot read the metadataset {where}: {' '.join(str(error).split())[:300] or type(error).__name__}") from None
    if split not in loaded.splits:
        flag = "--split-part" if not within else "--dataset"
        raise ConfigError(flag, f"the metadataset {where} has no {split!r} split: its splits are {', '.join(sorted(loaded.splits)) or 'none'}")
    return _node_leaves(loaded.splits[split], path, split, scale, f"{where}: splits.{split}")


def _entry_naming(path: Path, missing: Path, depth: int = 0) -> str | None:
    """Where in ``path``'s YAML (or a metadataset it nests) a ``path:`` leads to ``missing``:
    ``splits.train.blend[1] (path x)``, nested ones chained."""
    try:
        import yaml

        tree = yaml.safe_load(path.read_text())
    except Exception:  # noqa: BLE001
        return None

    if not isinstance(path, Path):  # in object storage: the error names the path alone
        return None

    def walk(node: Any, at: str) -> str | None:
        if isinstance(node, dict):
            value = node.get("path")
            if isinstance(value, str):
                target = path.parent / value
                if target.resolve() == missing.resolve():
                    return f"{at} (path {value})"
                if target.is_file() and depth < 8:
                    inner = _entry_naming(target, missing, depth + 1)
                    if inner is not None:
                        return f"{at} (path {value}): {target}: {inner}"
            items = list(node.items())
        elif isinstance(node, list):
            items = [(f"[{k}]", item) for k, item in enumerate(node)]
        else:
            return None
        for name, child in items:
            found = walk(child, f"{at}{name}" if str(name).startswith("[") else f"{at}.{name}" if at else str(name))
            if found is not None:
                return found
        return None

    return walk(tree, "")


def _node_leaves(node: Any, path: Path, split: str, scale: Fraction, at: str) -> list[Leaf]:
    kind = type(node).__name__
    if kind == "MetadatasetBlend":
        entries, mode = [(ref, Fraction(str(ref.weight)), f"{at}.blend[{k}]") for k, ref in enumerate(node.blend)], "weight"
        total = sum(weight for _, weight, _ in entries)
        if any(weight < 0 for _, weight, _ in entries) or total <= 0:
            raise ConfigError("--dataset", f"{at}.blend: weights must be >= 0 and not all 0")
        entries = [(ref, scale * weight / total, entry) for ref, weight, entry in entries]
    elif kind == "MetadatasetBlendEpochized":
        entries, mode = [(ref, scale * Fraction(str(ref.repetitions)), f"{at}.blend_epochized[{k}]")
                         for k, ref in enumerate(node.blend_epochized)], "repetitions"
        if any(factor < 0 for _, factor, _ in entries):
            raise ConfigError("--dataset", f"{at}.blend_epochized: repetitions must be >= 0")
    elif kind == "DatasetReference":
        entries, mode = [(node, scale, at)], "weight"
    else:
        raise ConfigError("--dataset", f"{at}: a {kind} is not read (mimo-pipes reads blend, blend_epochized and dataset references)")
    leaves = []
    for ref, factor, entry in entries:
        named = f"{entry} (path {ref.path})"
        if type(ref).__name__.endswith("JoinDatasetReference") or getattr(ref, "subset", None) is not None:
            raise ConfigError("--dataset", f"{named}: joins and subsets are not read; blend whole datasets")
        if getattr(ref, "dataset_config", None) not in (None, "dataset.yaml") or getattr(ref, "split_config", None) not in (None, "split.yaml"):
            raise ConfigError("--dataset", f"{named}: only dataset.yaml and split.yaml configs are read")
        remote = not ref.path.is_local()  # named in object storage (an EPath on the multi-storage client)
        target = ref.path if remote else Path(str(ref.path))
        part_split = ref.split_part or split
        if _request(target, target.is_file):  # a nested metadataset
            leaves += _leaves(target, part_split, factor, within=f"{named}: ")
        elif is_energon(str(target) if remote else target):
            leaves.append(Leaf(str(target) if remote else target, part_split, (mode, factor), f"{named}, split_part {part_split!r}"))
        elif not _request(target, target.is_dir):  # not a file either (asked above): nothing there
            raise ConfigError("--dataset", f"{named}: {target} does not exist")
        elif remote:
            raise ConfigError("--dataset", f"{named}: {target} is not a prepared Energon dataset (it has no .nv-meta/dataset.yaml)")
        else:
            raise ConfigError("--dataset", f"{named}: {unprepared(target) or f'{target} is not a prepared Energon dataset (it has no .nv-meta/)'}")
    return leaves
