"""Per-sample (image tokens, real tokens, placeholder runs) of a whole dataset, cheaply, and cached.

With a :class:`~mimo_pipes.data.processing.processor.SampleProcessor` (every family), rows are counted as the graph
counts them before its exchange (:meth:`~mimo_pipes.data.processing.row_counter.RowCounter.counts`): image
and video headers through the family's resize rule, the text through the tokenizer, far cheaper than
decoding and patchifying every image. Every image form is counted so (bytes, paths, ``{"bytes", "path"}``
values of ``datasets.Image`` columns, which are read undecoded whatever the features say, PIL images,
arrays); a row whose sizes no header gives is processed, and :class:`RowCounts` says how many were and why.
Another processor (or a ``row_counter``) runs on each row and its output is counted, as the graph's
CostAnnotator counts processed samples. Tests check both agree.
The placeholder runs (one per image or video) are what a time model (``--reorder-cost-model``) prices.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mimo_pipes.data.bad_rows import placed
from mimo_pipes.data.bad_rows.complete_files import check_row_images
from mimo_pipes.data.cache import cache_root
from mimo_pipes.data.processing.processor import SampleProcessor
from mimo_pipes.data.processing.row_counter import RowCount, RowCounter
from mimo_pipes.data.sources.open_source import read_rows
from mimo_pipes.data.storage.s3_url import is_s3
from mimo_pipes.errors import SampleError, row_reason
from mimo_pipes.samples.cost import image_token_count, placeholder_runs, real_token_count
from mimo_pipes.samples.sample import SAMPLE_ID
from mimo_pipes.time_model.model import TimeModel

CACHE_VERSION = "v4"  # v2: placeholder runs kept when asked for; v3: rows processed for their cost, and why; v4: keyed by the image folder
CHUNK_ROWS = 2048  # rows read from the dataset at a time: memory bounded by one chunk of encoded images

UNCOUNTED = -1  # real tokens of a row when they were not asked for

TokenCounts = tuple[np.ndarray, np.ndarray]
"""(image_tokens, real_tokens): int64 arrays indexed by dataset row."""

CustomCounter = Callable[[Mapping[str, Any]], tuple[int, int]]
"""A caller's own way to count one dataset row -> (image tokens, real tokens)."""



@dataclass(frozen=True)
class RowCounts:
    """Per dataset row: image tokens, real tokens, and its placeholder runs (``run_lengths`` flat, row i
    owning ``runs_per_row[i]`` of them in order; None where they were not counted). ``processed_for_cost``:
    how many rows were processed to count them, since no header gave their sizes, with each distinct reason
    and its rows in ``processed_reasons`` (None: counted by a processor or ``row_counter`` of the caller's)."""

    image_tokens: np.ndarray
    real_tokens: np.ndarray
    run_lengths: np.ndarray | None = None
    runs_per_row: np.ndarray | None = None
    processed_for_cost: int | None = None
    processed_reasons: Mapping[str, int] = field(default_factory=dict)
    bad_rows: Mapping[int, str] = field(default_factory=dict)  # with skip_bad: each row that cannot be counted, and why

    def encoder_costs(self, model: TimeModel) -> np.ndarray:
        """Each row's modelled encoder time in ns, exactly as the graph's CostAnnotator prices it."""
        if self.run_lengths is None or self.runs_per_row is None:
            raise ValueError("a time model needs each row's placeholder runs: count_rows(..., runs=True) without a row_counter")
        ends = np.cumsum(self.runs_per_row).tolist()
        runs = self.run_lengths.tolist()
        times = [model.encoder_time_ns(runs[a:b]) for a, b in zip([0, *ends[:-1]], ends)]
        return np.array(times, dtype=np.int64 if max(times, default=0) < 2**63 else object)  # analyze refuses what leaves int64


def _processed_count(processor: Callable[[Mapping[str, Any]], Mapping[str, Any]], image_token_id: int | Sequence[int],
                     runs: bool = False) -> Callable[[Mapping[str, Any]], RowCount]:
    def count(row: Mapping[str, Any]) -> RowCount:
        sample = processor(dict(row))
        ids = sample["input_ids"]
        lengths = placeholder_runs(ids, image_token_id) if runs else []
        return image_token_count(ids, image_token_id), real_token_count(sample["attention_mask"]), lengths

    return count


def processed_counter(processor: Callable[[Mapping[str, Any]], Mapping[str, Any]], image_token_id: int | Sequence[int]) -> CustomCounter:
    """Counts from a fully processed row: exactly what the graph's CostAnnotator counts."""
    count = _processed_count(processor, image_token_id)
    return lambda row: count(row)[:2]


def fingerprint(dataset: Any, processor: Any, real_tokens: bool = True, runs: bool = False, skip_bad: bool = False,
                decode: bool = False, whole_files: bool = False) -> str | None:
    """Cache key of a dataset's counts under a processor's settings; None when the dataset has none."""
    data_key = getattr(dataset, "_fingerprint", None)
    if data_key is None:
        return None
    image_processor = getattr(processor, "image_processor", None)
    settings = {
        "version": CACHE_VERSION,
        "real_tokens": real_tokens,
        "runs": runs,
        "dataset": data_key,
        "rows": len(dataset),
        "processor": type(processor).__qualname__,
        "seq_length": getattr(processor, "seq_length", None),
        # Paths in the data resolve inside it: another folder gives other sizes, other bad rows, other reasons.
        "image_folder": _folder_key(getattr(processor, "image_folder", None)),
        "image_processor": image_processor.to_dict() if hasattr(image_processor, "to_dict") else repr(image_processor),
        "tokenizer": hashlib.sha256(processor._tokenizer.to_str().encode()).hexdigest() if hasattr(processor, "_tokenizer") else repr(processor),
    }
    if skip_bad:  # only then are bad rows kept (without, the first one stops the count and nothing is cached)
        settings["skip_bad"] = True
    if decode:  # rows processed whole: a row bad only when its images are decoded is bad here
        settings["decode"] = True
    if whole_files:  # image files not whole are bad rows here
        settings["whole_files"] = True
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _folder_key(folder: str | None) -> list[str] | None:
    """The folder as given (bad rows' reasons name it so) and where it leads."""
    return None if folder is None else [folder, os.path.realpath(os.path.expanduser(folder))]


def count_tokens(
    dataset: Any,
    processor: Any,
    *,
    row_counter: CustomCounter | None = None,
    real_tokens: bool = True,
    use_cache: bool = True,
    progress: Callable[[int], None] | None = None,
) -> TokenCounts:
    """(image tokens, real tokens) of every row of ``dataset`` as ``processor`` would produce them
    (:func:`count_rows` without the placeholder runs)."""
    counts = count_rows(dataset, processor, row_counter=row_counter, real_tokens=real_tokens, use_cache=use_cache, progress=progress)
    return counts.image_tokens, counts.real_tokens


def count_rows(
    dataset: Any,
    processor: Any,
    *,
    row_counter: CustomCounter | None = None,
    real_tokens: bool = True,
    runs: bool = False,
    use_cache: bool = True,
    progress: Callable[[int], None] | None = None,
    skip_bad: bool = False,
    decode: bool = False,
    whole_files: bool = False,
) -> RowCounts:
    """Image tokens, real tokens and, with ``runs``, the placeholder runs of every row of ``dataset`` as
    ``processor`` would produce them (runs are what a time model prices; finding them costs a pass over
    each row's ids).

    ``row_counter`` overrides how one row is counted (for processors this module does not know; it gives
    no placeholder runs); by default the resize rule where it applies, else the processor itself.
    ``progress(n)`` is called with the rows done after each chunk. Counts are cached under the dataset's
    fingerprint and the processor's settings (HF datasets only). ``real_tokens=False`` reports real tokens
    as ``UNCOUNTED``: a vision-only cost needs none. ``skip_bad`` (``--skip-bad-samples``): a row whose
    counting raises SampleError counts 0 and is listed in ``bad_rows`` with its reason, as the run reports
    it; without, its SampleError is raised. ``decode``: every row processed whole, images decoded (what a
    graph under ``--exchange-payload samples`` does before counting), so a row whose image fails only when
    decoded is a bad row here too; slower, the counts are the same. ``whole_files``: a row whose image file is
    not whole (cut after its header: ``data.complete_files``) raises its SampleError before it is counted, as
    the graph checks it under the rows payload with ``--skip-bad-samples``."""
    runs = runs and row_counter is None
    key = fingerprint(dataset, processor, real_tokens, runs, skip_bad, decode, whole_files) if use_cache and row_counter is None else None
    path = cache_root() / "analyze" / f"tokens-{key}.npz" if key else None
    if path is not None and path.is_file():
        with np.load(path) as cached:
            counts = RowCounts(cached["image_tokens"], cached["real_tokens"], *(cached[name] for name in ("run_lengths", "runs_per_row") if runs),
                               processed_for_cost=int(cached["processed_for_cost"]),
                               processed_reasons=json.loads(str(cached["processed_reasons"])),
                               bad_rows={int(row): why for row, why in json.loads(str(cached["bad_rows"])).items()} if "bad_rows" in cached else {})
        if progress is not None:
            progress(len(dataset))
        return counts
    counts = _count_all(dataset, processor, row_counter, real_tokens, runs, progress, skip_bad, decode, whole_files)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{np.random.default_rng().integers(1 << 30)}.tmp.npz")
        kept = {"run_lengths": counts.run_lengths, "runs_per_row": counts.runs_per_row} if runs else {}
        np.savez(partial, image_tokens=counts.image_tokens, real_tokens=counts.real_tokens, **kept,
                 processed_for_cost=np.int64(counts.processed_for_cost), processed_reasons=np.str_(json.dumps(counts.processed_reasons)),
                 bad_rows=np.str_(json.dumps(counts.bad_rows)))
        partial.replace(path)
    return counts


class _SizeCounter:
    """Counts a row from its sizes, as the graph counts it before moving it (the built-in processor class)."""

    def __init__(self, processor: SampleProcessor, runs: bool, whole_files: bool = False) -> None:
        self.sized = RowCounter(processor)
        self.runs = runs
        self.whole_files = whole_files

    def __call__(self, row: Mapping[str, Any]) -> RowCount:
        row = dict(row)
        if self.whole_files:  # checked before counting, as RowCounter.count checks it
            check_row_images(row, self.sized.processor.image_folder, row.get(SAMPLE_ID, row.get("id")))
        return self.sized.counts(row, runs=self.runs)


def _row_counter(processor: Any, row_counter: CustomCounter | None, runs: bool, decode: bool = False,
                 whole_files: bool = False) -> Callable[[Mapping[str, Any]], RowCount]:
    if row_counter is not None:
        return _without_runs(row_counter)
    if type(processor) is SampleProcessor and not decode:
        return _SizeCounter(processor, runs, whole_files)
    return _processed_count(processor, getattr(processor, "placeholder_ids", processor.image_token_id), runs)


def _without_runs(row_counter: CustomCounter) -> Callable[[Mapping[str, Any]], RowCount]:
    """A custom counter gives no placeholder runs: an empty list each (dropped from the result)."""
    return lambda row: (*row_counter(row), [])


def _fetcher(processor: Any) -> Callable[[list, int], None]:
    """With images by path in object storage, what starts fetching the files of the rows ``MIMO_PIPES_S3_PREFETCH_ROWS``
    after the one counted next (as a run's graph fetches them ahead of its processing threads); otherwise nothing."""
    folder = getattr(processor, "image_folder", None)
    if not is_s3(folder):
        return lambda rows, offset: None
    from mimo_pipes.data.storage.s3_images import prefetch_media, prefetch_rows

    ahead = prefetch_rows()

    def fetch(rows: list, offset: int) -> None:
        for later in rows[(0 if offset == 0 else offset + ahead): offset + ahead + 1]:
            if isinstance(later, dict):
                prefetch_media(later, str(folder))

    return fetch


def _count_all(dataset: Any, processor: Any, row_counter: CustomCounter | None, real: bool, runs: bool,
               progress: Callable[[int], None] | None, skip_bad: bool = False, decode: bool = False, whole_files: bool = False) -> RowCounts:
    size = len(dataset)
    image_tokens = np.zeros(size, dtype=np.int64)
    real_tokens = np.zeros(size, dtype=np.int64)
    runs_per_row = np.zeros(size, dtype=np.int64)
    run_lengths: list[int] = []
    counter = _row_counter(processor, row_counter, runs, decode, whole_files)
    sized = isinstance(counter, _SizeCounter)
    bad: dict[int, str] = {}  # with skip_bad: a row that cannot be counted counts 0, and why is kept
    fetch_ahead = _fetcher(processor)
    for start in range(0, size, CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, size)
        # Rows counted from their sizes are read a chunk at a time, images left encoded; a processor gets them as indexed.
        rows = read_rows(dataset, start, stop) if sized else [dataset[index] for index in range(start, stop)]
        for offset, row in enumerate(rows):
            if isinstance(row, dict):  # so a bad row's error names its index, as in the graph
                row.setdefault("sample_id", start + offset)
        counts = []
        for offset, row in enumerate(rows):
            fetch_ahead(rows, offset)
            try:
                counts.append(counter(row))
            except SampleError as error:
                if not skip_bad:
                    raise
                bad[start + offset] = row_reason(placed(error, row))
                counts.append((0, 0, []))
        for offset, (images, text_and_images, lengths) in enumerate(counts):
            image_tokens[start + offset] = images
            real_tokens[start + offset] = text_and_images if real else UNCOUNTED
            runs_per_row[start + offset] = len(lengths)
            run_lengths.extend(lengths)
        if progress is not None:
            progress(stop - start)
    counts = RowCounts(image_tokens, real_tokens, bad_rows=dict(sorted(bad.items())))
    if runs:
        counts = RowCounts(image_tokens, real_tokens, np.array(run_lengths, dtype=np.int64), runs_per_row, bad_rows=dict(sorted(bad.items())))
    if sized:
        counts = replace(counts, processed_for_cost=counter.sized.processed_for_cost, processed_reasons=counter.sized.processed_for_cost_reasons)
    elif row_counter is None:  # a processor of the caller's: every row processed
        why = (f"{type(processor).__name__} counts no header" if not decode
               else "every image decoded to find rows bad only when decoded (--exchange-payload samples)")
        counts = replace(counts, processed_for_cost=size, processed_reasons={why: size})
    return counts
