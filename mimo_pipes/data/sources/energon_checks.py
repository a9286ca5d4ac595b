"""What is checked of an Energon dataset once, before any rank starts (``prepare``) and by ``mimo-pipes
check``, so that a fault of a whole shard or of the ``dataset.yaml`` is said once, not once per sample:

* :func:`shard_problems`: every shard of the split whose file or index is missing, whose index holds
  another count than ``.info.json``, or that is cut short (the samples past the cut), each once with the
  samples it takes; from file sizes and one read of each index's last entry (no sample is read);
* :func:`check_samples`: the first samples of the first readable shard against ``dataset.yaml``: a
  ``field_map`` field that none of them has, or a sample type none of them fits, is refused naming the file.

A run without ``--skip-bad-samples`` refuses a dataset with shard problems; with it, each is said once and
its samples are replaced as bad rows.
"""

from __future__ import annotations

import bisect
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from mimo_pipes.data import bad_rows
from mimo_pipes.data.sources.energon_source import EnergonDataset, ShardFault, is_header
from mimo_pipes.errors import ConfigError

PEEK_SAMPLES = 8
"""Samples of the first readable shard a ``dataset.yaml`` is checked against."""


@dataclass(frozen=True)
class ShardProblem:
    """Samples ``first .. first + count - 1`` of shard ``shard`` (of ``samples``; ``position``: its place in
    ``split.yaml``) cannot be read: ``kind`` (a bad_rows phrase) and why; ``start``: the dataset row of the
    shard's first sample."""

    position: int
    shard: str
    samples: int
    first: int
    count: int
    start: int
    kind: str
    reason: str

    @property
    def rows(self) -> range:
        return range(self.start + self.first, self.start + self.first + self.count)

    @property
    def text(self) -> str:
        held = f"{self.count} samples" if self.count == self.samples else f"{self.count} of its {self.samples} samples"
        rows = f"dataset row {self.rows.start}" if self.count == 1 else f"dataset rows {self.rows.start}..{self.rows.stop - 1}"
        return f"{self.shard} ({held}, {rows})"


def shard_problems(dataset: EnergonDataset) -> list[ShardProblem]:
    """Each shard of ``dataset``'s split that cannot be read whole, once, in ``split.yaml``'s order."""
    from megatron.energon.flavors.webdataset.itar import ITAR_SUFFIX

    found = []
    for shard, name in enumerate(dataset.shards):
        count = dataset.counts[shard]
        path = dataset.path / name
        if getattr(dataset, "remote", None) and count:
            from mimo_pipes.data.sources.energon_remote import epath, remote_unreadable

            why = remote_unreadable(epath(dataset.remote) / name, path.with_suffix(ITAR_SUFFIX), count)
        else:
            why = _unreadable(path, path.with_suffix(ITAR_SUFFIX), count) if count else None
        if why is not None:
            kind, reason, first = why
            found.append(ShardProblem(shard, name, count, first, count - first, dataset.starts[shard], kind, reason))
    return found


def _unreadable(path, index, count: int) -> tuple[str, str, int] | None:
    """(kind, why, first sample it takes) when the shard at ``path`` (``count`` samples, indexed by
    ``index``) cannot be read whole; None when it can."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return bad_rows.MISSING_SHARD, f"the shard {path} does not exist", 0
    except OSError as error:
        return bad_rows.MISSING_SHARD, f"the shard {path} cannot be read ({error.strerror})", 0
    if not stat.S_ISREG(info.st_mode):
        return bad_rows.MISSING_SHARD, f"the shard {path} is not a file", 0
    try:
        entries = os.stat(index).st_size // 8
    except OSError:
        return bad_rows.STALE_INDEX, f"the shard has no index ({index.name}): prepare the dataset again", 0
    if entries != count + 1:
        return bad_rows.STALE_INDEX, f"its index holds {entries - 1} samples but .info.json says {count}: prepare the dataset again", 0
    try:
        cut = _first_cut(path, index, count, info.st_size)
    except OSError as error:
        return bad_rows.MISSING_SHARD, f"the shard or its index cannot be read ({error.strerror or error})", 0
    if cut is None:
        return None
    return bad_rows.TRUNCATED_SHARD, f"the shard ends at byte {info.st_size}, inside its sample {cut} (counting from 0): it is truncated", cut


def _first_cut(shard, index, count: int, size: int) -> int | None:
    """The first sample that ends past ``size`` bytes of a shard cut short; None when the shard is whole, or
    when the index points at no tar member there (the shard changed: each such sample says so when read)."""
    import numpy as np

    with open(index, "rb") as handle:
        handle.seek(8 * count)
        end = int(np.frombuffer(handle.read(8), dtype=np.uint64)[0])
        if end <= size:
            return None
        handle.seek(0)
        offsets = np.frombuffer(handle.read(8 * (count + 1)), dtype=np.uint64)
    cut = int(np.searchsorted(offsets[1:], size, side="right"))  # sample j spans offsets[j]..offsets[j + 1]
    with open(shard, "rb") as handle:
        handle.seek(int(offsets[cut]))
        head = handle.read(512)
    return cut if len(head) < 512 or is_header(head) else None


@dataclass(frozen=True)
class SourceProblem:
    """A shard problem as a source's rows see it: ``order`` sorts it among the rows' places (``check``),
    ``text`` says where (a blend's part first), ``rows``: the source's rows it takes."""

    order: tuple[int, ...]
    text: str
    kind: str
    reason: str
    rows: int


def source_problems(source: object) -> tuple[list[SourceProblem], Callable[[int], bool]]:
    """The shard problems of an Energon dataset or blend, and whether a row of it is one they take."""
    parts = getattr(source, "parts", None)
    if parts is None:  # one dataset
        found = shard_problems(source)  # type: ignore[arg-type]
        problems = [SourceProblem((p.position, p.first), p.text, p.kind, p.reason, p.count) for p in found]
        return problems, _covers([p.rows for p in found])
    problems, covered = [], []
    for index, (part, count, name) in enumerate(zip(parts, source.order.counts, source.names)):  # type: ignore[attr-defined]
        found = shard_problems(part)
        covered.append(_covers([p.rows for p in found]))
        for p in found:
            rows = _items_in(count, len(part), p.rows)
            problems.append(SourceProblem((index, p.position, p.first, -1), f"{name}: {p.text}; {rows} rows of the blend", p.kind, p.reason, rows))
    return problems, _BlendRows(source, covered)


class _BlendRows:
    """Whether a blend row is a sample its part's problems take."""

    def __init__(self, blend: object, covered: list[Callable[[int], bool]]) -> None:
        self.blend, self.covered = blend, covered

    def __call__(self, row: int) -> bool:
        part, sample = self.blend.locate(row)  # type: ignore[attr-defined]
        return self.covered[part](sample)


def _covers(ranges: list[range]) -> Callable[[int], bool]:
    """Whether a row is in one of ``ranges`` (in order, disjoint)."""
    starts = [r.start for r in ranges]
    return lambda row: (k := bisect.bisect_right(starts, row) - 1) >= 0 and row in ranges[k]


def _items_in(items: int, samples: int, rows: range) -> int:
    """How many of a blend part's ``items`` (item j is sample j mod ``samples``) fall on ``rows``."""
    whole, rest = divmod(items, samples)
    return whole * len(rows) + max(0, min(rest, rows.stop) - rows.start)


def refuse_source_problems(problems: list[SourceProblem], where: str) -> None:
    """ConfigError naming every problem shard once (a run without ``--skip-bad-samples``)."""
    if not problems:
        return
    rows = sum(problem.rows for problem in problems)
    listed = "; ".join(f"{p.text}: {p.kind}: {p.reason}" for p in problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    raise ConfigError("--dataset", f"{where}: {len(problems)} shard(s) cannot be read ({rows} rows): {listed}; "
                                   "mend them, or pass --skip-bad-samples to replace their rows")


def check_samples(dataset: EnergonDataset, peek: int = PEEK_SAMPLES) -> None:
    """ConfigError naming ``dataset.yaml`` when none of the first ``peek`` samples of the first readable
    shard has a ``field_map`` field, or none makes a conversation of the declared type."""
    from mimo_pipes.data.sources.energon_samples import UnfitSample, field_errors, sample_row

    read: list[tuple[str, dict[str, bytes]]] = []
    for shard, count in enumerate(dataset.counts):
        for sample in range(min(peek, count)):
            try:
                read.append(dataset.read(shard, sample, every_part=True))
            except (ShardFault, OSError):
                break
        if read:
            break
    else:
        return  # no readable shard: its problems are the shards' (shard_problems)
    name = dataset.shards[shard]
    what = f"none of the first {len(read)} samples of {name} (keys {', '.join(key for key, _ in read[:3])}{', ...' if len(read) > 3 else ''})"
    missing = field_errors(dataset.kind, read)
    if missing:
        field, spec, error = missing[0]
        parts = sorted({part for _, parts in read for part in parts})
        raise ConfigError("--dataset", f"{dataset.config_file}: the field_map maps {field} to {spec!r}, which {what} has "
                                       f"(their parts: {', '.join(parts) or 'none'}; {error})")
    reasons = []
    for key, parts in read:
        try:
            sample_row(dataset.kind, parts, name, key)
            return
        except UnfitSample as unfit:
            reasons.append(str(unfit))
    raise ConfigError("--dataset", f"{dataset.config_file}: {what} fits it: {reasons[0]}")
