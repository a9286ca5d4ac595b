"""One rank's samples per second by processing workers: mimo-pipes against a torch DataLoader anchor, same rows.

Generates document-heavy SFT data of its own (camera photos of 0.3-12 MP, A4 pages scanned at 300 dpi, 2-4
images a row, about 22% text-only rows; JPEG files named by a JSON-lines dataset, read through
``PipelineConfig.dataset`` with the default image folder), and the built-in processor (a Qwen2-VL image processor,
PIL backend, at most 1280 placeholder tokens, about 1 MP, an image; built offline). Then, side by side, each in a
fresh process of its own (``--smoke``: every cell in one), for 1, 2, 4, ... workers up to the cores:

- ``anchor``: ``torch.utils.data.DataLoader`` with worker processes, each decoding a row's images as
  transformers' ``load_image`` does, running transformers' image processor and tokenizer on it, and
  collating its micro-batch of 8 (padding ``input_ids``, concatenating ``pixel_values``);
- mimo-pipes, one rank (``RankLayout(0, 1, 1)``), ``vlm_sft.build`` with the given workers
  (``PipelineConfig.num_workers``), global micro-batch 8, for each payload (``rows``: processed after the
  exchange by RowProcessor; ``samples``: processed before it by torchdata's mapper) and method (``thread``,
  ``process``, or ``auto``: the library's default, processes from 2 workers); ``rows/thread/ahead1`` is ``rows/thread`` with RowProcessor's rows in flight as they were before
  they followed the workers (one window ahead), ``.../copied`` with each resized image's pixels copied out of PIL
  as before (``np.asarray``) instead of viewed, ``.../held`` with text tokenized holding the GIL as before; all
  three (``rows/thread/ahead1/copied/held``) is the code before, for side-by-side comparisons;
  ``rows/thread/fresh`` makes every micro-batch's pixel buffer fresh, as before RowProcessor's buffer pool;
  ``rows/thread/perrow`` reads a row at a time and deep-copies every state, as before the reader read a step's rows
  together; ``rows/thread/copiedout`` lays each row's pixels out in an array of its own and copies them into the
  micro-batch's buffer, as before they were laid out there; ``rows/thread/trimmed`` leaves the C allocator at glibc's
  defaults (freed blocks given back to the kernel and faulted in again), as before it kept them. Any variant may end in ``/si<ms>`` (``/si0p5``: 0.5 ms): the interpreter's switch interval set in its
  process (``sys.setswitchinterval``), how long a thread waiting for the GIL waits before the holder must let go;
  and in ``/ra<n>``: RowProcessor keeps ``n`` rows a worker in flight (``ROWS_AHEAD_PER_WORKER``).

``--light`` (``--scale 0.25``: every image's sides a quarter) makes rows of the issue's kind, about 50 ms of the
anchor's CPU a row instead of 0.3-0.6 s, where the anchor reaches hundreds of samples/s on 16 cores and the
pipeline's own ceiling shows.

Each run takes micro-batches as fast as they come for ``--seconds`` after ``--warmup`` of them (default: twice the
workers, at least 3: the anchor's workers each make a whole micro-batch and hand them over in bursts, its queue
holding two a worker; the warm-up drains the first burst, so that what is measured is the steady rate) and reports
samples/s, and the consumer thread's CPU milliseconds per micro-batch (the serial work a rank's consumer does:
balance, collation, padding, what it waits on under the GIL). A run lasts at least ``--min-microbatches``
micro-batches too, so that a slow cell (one worker) is measured over enough of them.

    python benchmarks/rank_throughput.py                     # workers 1, 2, 4, ... up to the cores; docs section
    python benchmarks/rank_throughput.py --workers 1,4,14 --variants anchor,rows/thread --seconds 30   # the 16-core host
    python benchmarks/rank_throughput.py --light --workers 1,14 --variants anchor,rows/thread,rows/thread/ahead1 --seconds 15
    python benchmarks/rank_throughput.py --smoke --no-docs   # a tiny run (CI)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _code_before import restore_code_before  # benchmarks/_code_before.py

MARKER = "rank_throughput.py results"
SECTION = "## One rank's throughput by workers (`benchmarks/rank_throughput.py`)"
VARIANTS = ("anchor", "rows/auto", "rows/thread", "rows/process", "samples/thread", "samples/process", "rows/thread/ahead1",
            "rows/thread/copied", "rows/thread/ahead1/copied", "rows/thread/held", "rows/thread/ahead1/copied/held",
            "rows/thread/fresh", "rows/thread/perrow", "rows/thread/copiedout",
            "rows/thread/trimmed", "rows/thread/copiedout/trimmed")
LIGHT_SCALE = 0.25
MICRO_BATCH = 8
SEQ_LENGTH = 8192
PROMPTS = ("Read the document and answer.", "What do these pictures show?", "Summarize the pages.", "Compare the images.")


# ----------------------------------------------------------------------------------------------------
# Data


def _photo(seed: int, megapixels: float, path: Path) -> None:
    """A smooth random scene with sensor-like grain, as a camera JPEG."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    aspect = float(rng.choice([4 / 3, 3 / 2, 16 / 9, 3 / 4]))
    width = int(math.sqrt(megapixels * 1e6 * aspect))
    height = int(megapixels * 1e6 / width)
    coarse = Image.fromarray(rng.integers(0, 255, (max(height // 64, 2), max(width // 64, 2), 3), dtype=np.uint8))
    scene = np.asarray(coarse.resize((width, height), Image.BICUBIC), dtype=np.int16)
    scene += rng.integers(-8, 9, (height, width, 1), dtype=np.int16)
    Image.fromarray(np.clip(scene, 0, 255).astype(np.uint8)).save(path, format="JPEG", quality=88)


def _scan(seed: int, path: Path, scale: float = 1.0) -> None:
    """An A4 page scanned at 300 dpi (2480 x 3508; ``scale`` times that at a lower resolution): lines of dark
    strokes on paper, in colour, as scanners save."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    width, height = int(2480 * scale), int(3508 * scale)
    page = Image.new("RGB", (width, height), (246, 244, 238))
    draw = ImageDraw.Draw(page)
    for y in range(int(180 * scale), height - int(180 * scale), max(int(58 * scale), 4)):
        x = int(200 * scale)
        while x < width - int(200 * scale):
            word = int(rng.integers(40, 260) * scale) + 1
            shade = int(rng.integers(20, 90))
            draw.rectangle([x, y, x + word, y + int(30 * scale)], fill=(shade, shade, shade + 10))
            x += word + max(int(28 * scale), 2)
    noisy = np.asarray(page, dtype=np.int16) + rng.integers(-4, 5, (height, width, 1), dtype=np.int16)
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(path, format="JPEG", quality=90)


def _image(args: tuple[int, str, float, str, float]) -> None:
    seed, kind, megapixels, path, scale = args
    if kind == "scan":
        _scan(seed, Path(path), scale)
    else:
        _photo(seed, megapixels * scale * scale, Path(path))


def generate(folder: Path, images: int, rows: int, seed: int = 0, scale: float = 1.0) -> Path:
    """``folder/data.jsonl`` naming JPEG files beside it: ``images`` distinct files (a third of them scans), and
    ``rows`` rows of 2-4 of them (22% text only). Built once per size. ``scale`` < 1 shrinks every image's sides
    (the smoke run's small data: the same kinds of rows at a fraction of the CPU)."""
    import multiprocessing

    import numpy as np

    dataset = folder / "data.jsonl"
    if dataset.is_file():
        return dataset
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    jobs = []
    for k in range(images):
        kind = "scan" if k % 3 == 2 else "photo"
        megapixels = float(math.exp(rng.uniform(math.log(0.3), math.log(12.0))))
        jobs.append((seed * 100003 + k, kind, megapixels, str(folder / f"{kind}{k:04d}.jpg"), scale))
    with multiprocessing.get_context("spawn").Pool(min(os.cpu_count() or 1, len(jobs))) as pool:
        pool.map(_image, jobs)
    lines = []
    for index in range(rows):
        count = 0 if rng.random() < 0.22 else int(rng.integers(2, 5))
        chosen = [Path(jobs[int(i)][3]).name for i in rng.choice(len(jobs), size=count, replace=False)]
        words = " ".join(str(w) for w in rng.integers(0, 10_000, int(rng.integers(20, 120))))
        lines.append(json.dumps({"id": index, "images": chosen, "prompt": PROMPTS[index % len(PROMPTS)],
                                 "response": f"The answer, in detail: {words}."}))
    dataset.write_text("\n".join(lines) + "\n")
    return dataset


# ----------------------------------------------------------------------------------------------------
# One measurement (in a process of its own)


def _anchor_loader(dataset: Path, processor: str, workers: int) -> Any:
    """A torch DataLoader whose worker processes run transformers' processor and tokenizer and collate."""
    import torch

    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    data = _AnchorRows(rows, str(dataset.parent), processor)
    sampler = torch.utils.data.RandomSampler(data, replacement=True, num_samples=10**7, generator=torch.Generator().manual_seed(0))
    return torch.utils.data.DataLoader(data, batch_size=MICRO_BATCH, sampler=sampler, num_workers=workers, collate_fn=_anchor_collate,
                                       multiprocessing_context="spawn" if workers else None, persistent_workers=workers > 0)


class _AnchorRows:
    """Rows processed as a transformers user would: ``load_image``'s decoding, the PIL image processor, the tokenizer."""

    def __init__(self, rows: list[dict], folder: str, processor: str) -> None:
        self.rows, self.folder, self.processor = rows, folder, processor
        self._loaded: Any = None

    def __len__(self) -> int:
        return len(self.rows)

    def _load(self) -> Any:
        if self._loaded is None:
            from transformers import AutoImageProcessor, AutoTokenizer

            self._loaded = AutoImageProcessor.from_pretrained(self.processor, backend="pil"), AutoTokenizer.from_pretrained(self.processor)
        return self._loaded

    def __getitem__(self, index: int) -> dict:
        import torch
        from PIL import Image, ImageOps

        image_processor, tokenizer = self._load()
        row = self.rows[index]
        images = []
        for name in row["images"]:
            with Image.open(os.path.join(self.folder, name)) as image:
                images.append(ImageOps.exif_transpose(image).convert("RGB"))
        out: dict[str, Any] = {}
        vision = ""
        if images:
            feats = image_processor(images=images, return_tensors="pt")
            out["pixel_values"], out["image_grid_thw"] = feats["pixel_values"], feats["image_grid_thw"]
            merge = image_processor.merge_size ** 2
            vision = "".join("<|vision_start|>" + "<|image_pad|>" * (int(g.prod()) // merge) + "<|vision_end|>" for g in feats["image_grid_thw"])
        text = f"<|im_start|>user\n{vision}{row['prompt']}<|im_end|>\n<|im_start|>assistant\n{row['response']}<|im_end|>\n"
        out["input_ids"] = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"][:SEQ_LENGTH])
        return out


def _anchor_collate(samples: list[dict]) -> dict:
    import torch

    length = max(s["input_ids"].shape[0] for s in samples)
    ids = torch.zeros((len(samples), length), dtype=torch.int64)
    for k, s in enumerate(samples):
        ids[k, : s["input_ids"].shape[0]] = s["input_ids"]
    batch = {"input_ids": ids, "attention_mask": ids != 0}
    with_pixels = [s for s in samples if "pixel_values" in s]
    if with_pixels:
        batch["pixel_values"] = torch.cat([s["pixel_values"] for s in with_pixels])
        batch["image_grid_thw"] = torch.cat([s["image_grid_thw"] for s in with_pixels])
    return batch


def _mimo_loader(dataset: Path, workers: int, payload: str, method: str) -> Any:
    from mimo_pipes.config import PipelineConfig
    from mimo_pipes.exchange import RankLayout
    from mimo_pipes_recipes import vlm_sft

    config = PipelineConfig(components=("language=dp=1",), micro_batch_size=MICRO_BATCH, seq_length=SEQ_LENGTH, dataset=str(dataset),
                            num_workers=workers, exchange_payload=payload, image_folder=str(dataset.parent))
    layout = RankLayout(dp_rank=0, dp_size=1, grid_size=1)
    try:
        import datasets  # noqa: F401 - what reads --dataset
    except Exception:  # noqa: BLE001 - a machine without a working datasets: the same rows from the file, the same graph
        return _mimo_from_rows(vlm_sft, config, layout, dataset, method)
    return vlm_sft.build(config, layout, processing=method)


def _mimo_from_rows(vlm_sft: Any, config: Any, layout: Any, dataset: Path, method: str) -> Any:
    """What ``vlm_sft.build`` makes, over the JSON lines read as a list (no ``datasets``)."""
    from mimo_pipes.data.from_config import open_processor
    from mimo_pipes.data.processing.module_processor import ModuleProcessor
    from mimo_pipes.data.processing.row_counter import RowCounter
    from mimo_pipes.samples.module_fields import module_fields

    processor = open_processor(config)
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    process_rows, map_fn = None, processor
    if config.exchange_payload == "rows":
        fields = module_fields(layout.module)
        map_fn, process_rows = RowCounter(processor, fields).count, ModuleProcessor(processor, fields)
    return vlm_sft.pipeline(rows, config, layout, map_fn=map_fn, image_token_id=processor.placeholder_ids,
                            pad_values={"input_ids": processor.pad_token_id, "labels": -100}, vision_fields=processor.vision_fields,
                            processing=method, process_rows=process_rows)


def measure(variant: str, workers: int, dataset: Path, processor: str, warmup: int, seconds: float, least: int = 2) -> dict:
    """Samples/s of ``variant`` with ``workers`` after ``warmup`` micro-batches, over at least ``seconds`` and ``least``
    micro-batches."""
    if variant == "anchor":
        loader = _anchor_loader(dataset, processor, workers)
    else:
        payload, method, *before = variant.split("/")
        restore_code_before(windows_ahead=1 if "ahead1" in before else None, copied_pixels="copied" in before,
                            held_encode="held" in before, fresh_buffers="fresh" in before, row_reads="perrow" in before,
                            copied_out="copiedout" in before, trimmed="trimmed" in before)
        for token in before:  # /si1, /si0p5: the interpreter's switch interval in ms (0p5: 0.5), the GIL's hand-over
            if token.startswith("si"):
                sys.setswitchinterval(float(token[2:].replace("p", ".")) / 1e3)
            if token.startswith("ra"):  # /ra4: RowProcessor keeps 4 rows a worker in flight
                from mimo_pipes.nodes import row_processor

                row_processor.ROWS_AHEAD_PER_WORKER = int(token[2:])
        loader = _mimo_loader(dataset, workers, payload, method)
    batches = iter(loader)
    start = time.perf_counter()
    for _ in range(warmup):
        next(batches)
    first = time.perf_counter() - start
    samples = taken = 0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    begin, thread_cpu, process_cpu = time.perf_counter(), time.thread_time(), time.process_time()
    while time.perf_counter() - begin < seconds or taken < least:
        batch = next(batches)
        samples += int(batch["input_ids"].shape[0])
        taken += 1
    elapsed, thread_cpu = time.perf_counter() - begin, time.thread_time() - thread_cpu
    process_cpu = time.process_time() - process_cpu
    after = resource.getrusage(resource.RUSAGE_SELF)
    if hasattr(loader, "close"):
        loader.close()
    return {"variant": variant, "workers": workers, "samples_per_s": samples / elapsed, "microbatches": taken,
            "consumer_cpu_ms_per_microbatch": 1000 * thread_cpu / taken, "warmup_s": first,
            # all of this process's threads (not worker processes'): the work a sample costs wherever it runs here
            "process_cpu_ms_per_sample": 1000 * process_cpu / samples,
            # where that CPU goes (the kernel's share: page faults, mapping and unmapping memory) and how often this
            # process's threads gave up the CPU waiting (a lock, the kernel's memory map) or were preempted
            "process_sys_ms_per_sample": 1000 * (after.ru_stime - usage.ru_stime) / samples,
            "minor_faults_per_sample": (after.ru_minflt - usage.ru_minflt) / samples,
            "voluntary_switches_per_sample": (after.ru_nvcsw - usage.ru_nvcsw) / samples,
            "involuntary_switches_per_sample": (after.ru_nivcsw - usage.ru_nivcsw) / samples}


# ----------------------------------------------------------------------------------------------------
# The table


def worker_counts(cores: int) -> list[int]:
    """1, 2, 4, ... below the cores, and the cores less two (a rank's own threads) where that is more."""
    counts = [1]
    while counts[-1] * 2 < cores:
        counts.append(counts[-1] * 2)
    if cores - 2 > counts[-1]:
        counts.append(cores - 2)
    return counts


def warmup_microbatches(workers: int) -> int:
    """Micro-batches taken before the clock starts: twice the workers (the anchor's first burst), at least 3."""
    return max(3, 2 * workers)


def measuring_processes(variants: list[str], shared: bool) -> list[list[str]]:
    """The cells each measuring process runs, in turn: one a process (no cell's figures disturbed by another's
    start-up, caches or patches), or with ``shared`` (the smoke, whose figures don't matter but whose start-ups, torch
    and transformers imported, are most of its CPU) every cell in one, the code before's patches lasting for the
    process: a cell that restores code before comes last in its process, one a process."""
    if not shared:
        return [[variant] for variant in variants]
    plain = [variant for variant in variants if len(variant.split("/")) <= 2]  # "payload/method/patch/...": code before
    before = [variant for variant in variants if variant not in plain]
    return [plain + before[:1], *([variant] for variant in before[1:])] if variants else []


def run_one(args: argparse.Namespace, variants: list[str], workers: int) -> list[dict]:
    """Each of ``variants`` measured in turn in one fresh process (see ``measuring_processes``)."""
    warmup = args.warmup if args.warmup is not None else warmup_microbatches(workers)
    command = [sys.executable, __file__, "--one", ",".join(variants), "--one-workers", str(workers), "--data", str(args.data),
               "--images", str(args.images), "--rows", str(args.rows), "--seconds", str(args.seconds), "--warmup", str(warmup),
               "--scale", repr(args.scale), "--min-microbatches", str(args.min_microbatches)]
    timeout = (args.timeout or 240 + 2 * args.seconds) * len(variants)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        return [{"variant": variant, "workers": workers, "error": f"no result within {expired.timeout:.0f} s"} for variant in variants]
    measured = {r["variant"]: r for r in (json.loads(line) for line in done.stdout.splitlines() if line.startswith("{"))}
    error = done.stderr.strip().splitlines()[-1] if done.returncode != 0 and done.stderr.strip() else "failed"
    return [measured.get(variant, {"variant": variant, "workers": workers, "error": error}) for variant in variants]


def table(results: list[dict], variants: list[str], counts: list[int]) -> str:
    by = {(r["variant"], r["workers"]): r for r in results}
    lines = ["| pipeline | " + " | ".join(f"{w} worker{'s' if w > 1 else ''}" for w in counts) + f" | {counts[-1]} / {counts[0]} |",
             "|---|" + "---:|" * (len(counts) + 1)]
    for variant in variants:
        cells, rates = [], []
        for w in counts:
            r = by.get((variant, w))
            if r is None or "error" in r:
                cells.append("failed" if r else "-")
                continue
            rates.append(r["samples_per_s"])
            cells.append(f"{r['samples_per_s']:.1f} ({r['consumer_cpu_ms_per_microbatch']:.0f} ms)")
        first, last = by.get((variant, counts[0]), {}), by.get((variant, counts[-1]), {})
        ratio = f"{last['samples_per_s'] / first['samples_per_s']:.1f}x" if len(counts) > 1 and "samples_per_s" in first and "samples_per_s" in last else "-"
        lines.append(f"| {variant} | " + " | ".join(cells) + f" | {ratio} |")
    for variant in variants:  # each of ours against the anchor, same workers
        if variant == "anchor":
            continue
        cells = []
        for w in counts:
            ours, anchor = by.get((variant, w), {}), by.get(("anchor", w), {})
            cells.append(f"{ours['samples_per_s'] / anchor['samples_per_s']:.2f}x" if "samples_per_s" in ours and "samples_per_s" in anchor else "-")
        if any(cell != "-" for cell in cells):
            lines.append(f"| {variant} / anchor | " + " | ".join(cells) + " | |")
    return "\n".join(lines)


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
                 platform.processor()) if Path("/proc/cpuinfo").is_file() else platform.processor()
    return f"{os.cpu_count()} cores (`nproc`), {model}, Python {platform.python_version()}"


def write_docs(text: str, docs: Path, label: str) -> None:
    marker = f"<!-- {MARKER}: {label} -->"
    current = docs.read_text() if docs.is_file() else ""
    start, end = current.find(marker), current.find(f"<!-- end {MARKER}: {label} -->")
    block = f"{marker}\n{text}\n<!-- end {MARKER}: {label} -->"
    if start >= 0 and end > start:
        current = current[:start] + block + current[end + len(f"<!-- end {MARKER}: {label} -->"):]
    else:
        current = current.rstrip("\n") + "\n\n" + (SECTION + "\n\n" if SECTION not in current else "") + block + "\n"
    docs.write_text(current)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "mimo-pipes-rank-throughput",
                        help="where the generated data goes (kept for the next run)")
    parser.add_argument("--images", type=int, default=60, help="distinct image files (default 60, a third scans)")
    parser.add_argument("--rows", type=int, default=1000, help="rows of the dataset, read again and again (default 1000)")
    parser.add_argument("--workers", default=None, help="comma-separated worker counts (default: 1, 2, 4, ... up to the cores)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="measured seconds per run (default 60: a row of this data takes 0.3-0.6 s of CPU)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="micro-batches before the clock starts (default: twice the workers, at least 3)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds one run may take, start-up and warm-up included (default: 240 + twice --seconds)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny (CI): 4 images at a sixth of their sides, 24 rows, 1 worker (a process of its own under anchor and "
                             "rows/process), anchor and rows, 1 second each, every cell in one measuring process")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--label", default="this machine", help="the docs block's name (one block per machine)")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--one-workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=float, default=1.0, help="every image's sides times this (default 1; --smoke: a sixth)")
    parser.add_argument("--light", action="store_true", help=f"rows of the issue's kind: --scale {LIGHT_SCALE}")
    parser.add_argument("--min-microbatches", type=int, default=None,
                        help="micro-batches measured at least, however long (default 20; --smoke: 2)")
    args = parser.parse_args(argv)
    if args.light:
        args.scale = LIGHT_SCALE
    if args.smoke:
        args.images, args.rows, args.seconds, args.warmup, args.scale = 4, 24, 1.0, 1, 1 / 6
        args.workers = args.workers or "1"  # a second worker process cost ~10 s of CPU (torch and transformers imported again)
        args.variants = "anchor,rows/thread,rows/process" if args.variants == ",".join(VARIANTS) else args.variants
    if args.min_microbatches is None:
        args.min_microbatches = 2 if args.smoke else 20
    folder = args.data / f"images{args.images}-rows{args.rows}{'' if args.scale == 1 else f'-scale{args.scale:.3f}'}"
    dataset = generate(folder, args.images, args.rows, scale=args.scale)
    from mimo_pipes.data.embedded.builtin_processor import default_processor_path

    processor = str(default_processor_path())
    if args.one is not None:
        for variant in args.one.split(","):
            print(json.dumps(measure(variant, args.one_workers, dataset, processor, args.warmup, args.seconds, args.min_microbatches)),
                  flush=True)
        return 0
    args.data = args.data.resolve()
    counts = [int(w) for w in args.workers.split(",")] if args.workers else worker_counts(os.cpu_count() or 1)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if re.sub(r"(/(si|ra)[0-9p]+)+$", "", v) not in VARIANTS]  # any variant may end in /si<ms>
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    results = []
    for workers in counts:
        measured: dict[str, dict] = {}
        for cells in measuring_processes(variants, shared=args.smoke):
            for result in run_one(args, cells, workers):
                measured[result["variant"]] = result
                print(json.dumps(result), flush=True)
        results.extend(measured[variant] for variant in variants)
    command = " ".join(["python benchmarks/rank_throughput.py", *(argv if argv is not None else sys.argv[1:])])
    text = (f"`{command}` on {machine()}, "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}: {args.images} image files, {args.rows} rows, micro-batch {MICRO_BATCH}, "
            f"images at {args.scale:g} of their sides, {args.seconds:g} s (and {args.min_microbatches} micro-batches) measured after "
            f"{args.warmup if args.warmup is not None else 'max(3, 2 x workers)'} micro-batches. Samples/s (the consumer thread's CPU ms per micro-batch).\n\n"
            + table(results, variants, counts))
    print(text)
    if args.out is not None:
        args.out.write_text(json.dumps({"machine": machine(), "results": results}, indent=1))
    if not args.no_docs:
        write_docs(text, Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md", args.label)
    return 0 if not any("error" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
