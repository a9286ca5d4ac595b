"""An Energon metadataset (a YAML file blending prepared datasets) as one map-style source with one global
order, the same in every process.

The rule. Part ``i`` has ``n_i`` samples (its ``train`` split, read as
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
"""

from __future__ import annotations

import heapq
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

from mimo_pipes.data import bad_rows
from mimo_pipes.data.sources.energon_source import EnergonDataset, energon, is_energon
from mimo_pipes.errors import ConfigError


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
        self.path = Path(path).expanduser()
        leaves = _leaves(self.path, split)
        self.parts = [EnergonDataset(leaf, split=part_split) for leaf, part_split, _ in leaves]
        sizes = [len(part) for part in self.parts]
        modes = {mode for _, _, (mode, _) in leaves}
        if len(modes) > 1:
            raise ConfigError("--dataset", f"{str(path)!r} mixes blend weights and blend_epochized repetitions")
        factors = [factor for _, _, (_, factor) in leaves]
        counts = repeated_counts(sizes, factors) if modes == {"repetitions"} else weighted_counts(sizes, factors)
        self.order = BlendOrder(counts)
        self.names = [str(leaf) for leaf, _, _ in leaves]
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


def _leaves(path: Path, split: str, scale: Fraction = Fraction(1)) -> list[tuple[Path, str, tuple[str, Fraction]]]:
    """(dataset folder, split, (mode, weight or repetitions)) of every dataset the metadataset blends."""
    energon()
    from megatron.energon.metadataset.loader import load_dataset

    try:
        loaded = load_dataset(str(path))
        node = loaded.splits[split]
    except KeyError:
        raise ConfigError("--dataset", f"{str(path)!r} has no {split!r} split") from None
    except Exception as error:  # noqa: BLE001 - Energon's parser names what it could not read
        raise ConfigError("--dataset", f"cannot read the metadataset {str(path)!r}: {' '.join(str(error).split())[:300]}") from None
    return _node_leaves(node, path, split, scale)


def _node_leaves(node: Any, path: Path, split: str, scale: Fraction) -> list:
    kind = type(node).__name__
    if kind == "MetadatasetBlend":
        entries, mode = [(ref, Fraction(str(ref.weight))) for ref in node.blend], "weight"
        total = sum(weight for _, weight in entries)
        if any(weight < 0 for _, weight in entries) or total <= 0:
            raise ConfigError("--dataset", f"{str(path)!r}: blend weights must be >= 0 and not all 0")
        entries = [(ref, scale * weight / total) for ref, weight in entries]
    elif kind == "MetadatasetBlendEpochized":
        entries, mode = [(ref, scale * Fraction(str(ref.repetitions))) for ref in node.blend_epochized], "repetitions"
        if any(factor < 0 for _, factor in entries):
            raise ConfigError("--dataset", f"{str(path)!r}: repetitions must be >= 0")
    elif kind == "DatasetReference":
        entries, mode = [(node, scale)], "weight"
    else:
        raise ConfigError("--dataset", f"{str(path)!r}: a {kind} is not read (mimo-pipes reads blend, blend_epochized and dataset references)")
    leaves = []
    for ref, factor in entries:
        if type(ref).__name__.endswith("JoinDatasetReference") or getattr(ref, "subset", None) is not None:
            raise ConfigError("--dataset", f"{str(path)!r}: joins and subsets are not read; blend whole datasets")
        if getattr(ref, "dataset_config", None) not in (None, "dataset.yaml") or getattr(ref, "split_config", None) not in (None, "split.yaml"):
            raise ConfigError("--dataset", f"{str(path)!r}: {ref.path}: only dataset.yaml and split.yaml configs are read")
        target = Path(str(ref.path))
        part_split = ref.split_part or split
        if target.is_file():  # a nested metadataset
            leaves += _leaves(target, part_split, factor)
        elif is_energon(target):
            leaves.append((target, part_split, (mode, factor)))
        else:
            raise ConfigError("--dataset", f"{str(path)!r}: {target} is not a prepared Energon dataset")
    return leaves
