"""Per-sample (image tokens, real tokens, placeholder runs) of a whole dataset, cheaply, and cached.

Where the processor is Qwen2-VL-style and the rows hold encoded images, the counts come from image
headers and the resize rule (``smart_resize`` -> patch grid -> placeholders) plus the tokenizer on the
text, which is far cheaper than decoding and patchifying every image. Anything else runs the processor
on each row and counts what it produced, as the graph's CostAnnotator does. Tests check both agree.
The placeholder runs (one per image or video) are what a time model (``--reorder-cost-model``) prices.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mimo_pipes.cost import image_token_count, placeholder_runs, real_token_count
from mimo_pipes.data.cache import cache_root
from mimo_pipes.data.conversation import row_images, row_videos
from mimo_pipes.data.media import resolve
from mimo_pipes.data.processor import SampleProcessor
from mimo_pipes.time_model.model import TimeModel

CACHE_VERSION = "v2"  # v2: placeholder runs kept when asked for
CHUNK_ROWS = 2048  # rows read from the dataset at a time: memory bounded by one chunk of encoded images

UNCOUNTED = -1  # real tokens of a row when they were not asked for

TokenCounts = tuple[np.ndarray, np.ndarray]
"""(image_tokens, real_tokens): int64 arrays indexed by dataset row."""

RowCounter = Callable[[Mapping[str, Any]], tuple[int, int]]
"""One dataset row -> (image tokens, real tokens)."""

RowCount = tuple[int, int, list[int]]
"""(image tokens, real tokens, placeholder run lengths) of one row."""


@dataclass(frozen=True)
class RowCounts:
    """Per dataset row: image tokens, real tokens, and its placeholder runs (``run_lengths`` flat, row i
    owning ``runs_per_row[i]`` of them in order; None where they were not counted)."""

    image_tokens: np.ndarray
    real_tokens: np.ndarray
    run_lengths: np.ndarray | None = None
    runs_per_row: np.ndarray | None = None

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


def processed_counter(processor: Callable[[Mapping[str, Any]], Mapping[str, Any]], image_token_id: int | Sequence[int]) -> RowCounter:
    """Counts from a fully processed row: exactly what the graph's CostAnnotator counts."""
    count = _processed_count(processor, image_token_id)
    return lambda row: count(row)[:2]


def _resize_rule(image_processor: Any) -> Callable[[int, int], int] | None:
    """(height, width) -> image placeholder tokens for a Qwen2-VL-style image processor, else None."""
    try:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    except ImportError:  # pragma: no cover - older transformers
        return None
    if not type(image_processor).__name__.startswith("Qwen2VLImageProcessor"):
        return None
    size = image_processor.size
    min_pixels = size.get("shortest_edge") if isinstance(size, Mapping) else getattr(size, "shortest_edge", None)
    max_pixels = size.get("longest_edge") if isinstance(size, Mapping) else getattr(size, "longest_edge", None)
    patch, merge = image_processor.patch_size, image_processor.merge_size
    if not (min_pixels and max_pixels and getattr(image_processor, "do_resize", True)):
        return None

    def tokens(height: int, width: int) -> int:
        resized_height, resized_width = smart_resize(height, width, factor=patch * merge, min_pixels=min_pixels, max_pixels=max_pixels)
        return (resized_height // patch) * (resized_width // patch) // merge**2

    return tokens


def _image_size(item: Any, image_folder: str | None) -> tuple[int, int]:
    """(height, width) from an encoded image's header, without decoding its pixels; a path only inside
    ``image_folder`` (as the processor opens it: :func:`~mimo_pipes.data.media.resolve`)."""
    from PIL import Image

    if isinstance(item, Image.Image):
        return item.height, item.width
    if isinstance(item, Mapping) and item.get("bytes") is not None:
        source: Any = io.BytesIO(item["bytes"])
    elif isinstance(item, Mapping) and item.get("path"):
        source = resolve(item["path"], image_folder, None, "image")
    else:
        raise TypeError(f"unsupported image {type(item).__name__}")
    with Image.open(source) as image:
        return image.height, image.width


class ResizeRuleCounter:
    """Counts of the built-in ``SampleProcessor``'s output from image sizes (headers only) and the chat's
    text, laid out by the processor's own :meth:`~mimo_pipes.data.processor.SampleProcessor.counts_from_sizes`."""

    def __init__(self, processor: Any, tokens_for_size: Callable[[int, int], int], fallback: Callable[[Mapping[str, Any]], RowCount],
                 real_tokens: bool = True, runs: bool = False) -> None:
        self.processor = processor
        self.real_tokens = real_tokens
        self.runs = runs  # placeholder runs cost a pass over every row's ids: only when a time model needs them
        self.tokens_for_size = tokens_for_size
        self.fallback = fallback

    def count_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[RowCount]:
        out = []
        for row in rows:
            try:
                if row_videos(row):
                    raise ValueError("videos are counted by processing")
                folder = getattr(self.processor, "image_folder", None)
                per_image = [self.tokens_for_size(*_image_size(item, folder)) for item in row_images(row)]
            except Exception:  # noqa: BLE001 - the processor counts it, or reports it with the row's name
                out.append(self.fallback(row))
                continue
            ids = self.processor.input_ids_from_sizes(dict(row), per_image)
            runs = placeholder_runs(ids, self.processor.placeholder_ids) if self.runs else []
            out.append((sum(per_image), len(ids) if self.real_tokens else UNCOUNTED, runs))
        return out


def _rows(dataset: Any, start: int, stop: int, encoded_images: bool) -> list[Mapping[str, Any]]:
    """Rows start..stop-1 as the graph's reader gets them (every column decoded by its feature, e.g. a LLaVA
    ``image`` column stored as JSON), read as one batch from a Hugging Face dataset when ``encoded_images``
    (its images are left encoded: bytes/path dicts)."""
    if encoded_images:
        columns = dataset.with_format(None)[start:stop]
        return [dict(zip(columns, values)) for values in zip(*columns.values())]
    return [dataset[index] for index in range(start, stop)]


def _is_hf_dataset(dataset: Any) -> bool:
    return hasattr(dataset, "with_format") and hasattr(dataset, "features")


def fingerprint(dataset: Any, processor: Any, real_tokens: bool = True, runs: bool = False) -> str | None:
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
        "image_processor": image_processor.to_dict() if hasattr(image_processor, "to_dict") else repr(image_processor),
        "tokenizer": hashlib.sha256(processor._tokenizer.to_str().encode()).hexdigest() if hasattr(processor, "_tokenizer") else repr(processor),
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:32]


def count_tokens(
    dataset: Any,
    processor: Any,
    *,
    row_counter: RowCounter | None = None,
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
    row_counter: RowCounter | None = None,
    real_tokens: bool = True,
    runs: bool = False,
    use_cache: bool = True,
    progress: Callable[[int], None] | None = None,
) -> RowCounts:
    """Image tokens, real tokens and, with ``runs``, the placeholder runs of every row of ``dataset`` as
    ``processor`` would produce them (runs are what a time model prices; finding them costs a pass over
    each row's ids).

    ``row_counter`` overrides how one row is counted (for processors this module does not know; it gives
    no placeholder runs); by default the resize rule where it applies, else the processor itself.
    ``progress(n)`` is called with the rows done after each chunk. Counts are cached under the dataset's
    fingerprint and the processor's settings (HF datasets only). ``real_tokens=False`` reports real tokens
    as ``UNCOUNTED``: a vision-only cost needs none."""
    runs = runs and row_counter is None
    key = fingerprint(dataset, processor, real_tokens, runs) if use_cache and row_counter is None else None
    path = cache_root() / "analyze" / f"tokens-{key}.npz" if key else None
    if path is not None and path.is_file():
        with np.load(path) as cached:
            counts = RowCounts(cached["image_tokens"], cached["real_tokens"], *(cached[name] for name in ("run_lengths", "runs_per_row") if runs))
        if progress is not None:
            progress(len(dataset))
        return counts
    counts = _count_all(dataset, processor, row_counter, real_tokens, runs, progress)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{np.random.default_rng().integers(1 << 30)}.tmp.npz")
        kept = {"run_lengths": counts.run_lengths, "runs_per_row": counts.runs_per_row} if runs else {}
        np.savez(partial, image_tokens=counts.image_tokens, real_tokens=counts.real_tokens, **kept)
        partial.replace(path)
    return counts


def _without_runs(row_counter: RowCounter) -> Callable[[Mapping[str, Any]], RowCount]:
    """A custom counter gives no placeholder runs: an empty list each (dropped from the result)."""
    return lambda row: (*row_counter(row), [])


def _count_all(dataset: Any, processor: Any, row_counter: RowCounter | None, real: bool, runs: bool,
               progress: Callable[[int], None] | None) -> RowCounts:
    size = len(dataset)
    image_tokens = np.zeros(size, dtype=np.int64)
    real_tokens = np.zeros(size, dtype=np.int64)
    runs_per_row = np.zeros(size, dtype=np.int64)
    run_lengths: list[int] = []
    fallback = _processed_count(processor, getattr(processor, "placeholder_ids", processor.image_token_id), runs)
    family = getattr(processor, "family", None)
    rule = _resize_rule(getattr(family, "image_processor", None)) if row_counter is None else None
    # Only the built-in processor's layout of patch families (one placeholder per merged patch) is laid out
    # from sizes here; any other processor is run as is.
    patches = type(processor) is SampleProcessor and type(family).__name__ == "PatchFamily"
    fast = ResizeRuleCounter(processor, rule, fallback, real, runs) if rule is not None and patches else None
    encoded = fast is not None and _is_hf_dataset(dataset)
    if fast is not None and not encoded:
        fast = None  # plain map-style rows: nothing cheaper than processing them
    counter = fallback if row_counter is None else _without_runs(row_counter)
    for start in range(0, size, CHUNK_ROWS):
        stop = min(start + CHUNK_ROWS, size)
        rows = _rows(dataset, start, stop, encoded)
        for offset, row in enumerate(rows):
            if isinstance(row, dict):  # so a bad row's error names its index, as in the graph
                row.setdefault("sample_id", start + offset)
        counts = fast.count_rows(rows) if fast is not None else [counter(row) for row in rows]
        for offset, (images, text_and_images, lengths) in enumerate(counts):
            image_tokens[start + offset] = images
            real_tokens[start + offset] = text_and_images if real else UNCOUNTED
            runs_per_row[start + offset] = len(lengths)
            run_lengths.extend(lengths)
        if progress is not None:
            progress(stop - start)
    if not runs:
        return RowCounts(image_tokens, real_tokens)
    return RowCounts(image_tokens, real_tokens, np.array(run_lengths, dtype=np.int64), runs_per_row)
