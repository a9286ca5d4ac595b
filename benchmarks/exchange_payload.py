"""What the exchange moves: dataset rows (``--exchange-payload rows``) against processed samples (``samples``).

Both payloads side by side in one run, on two data sets: the embedded data, and a generated realistic set
(JPEG photos of 0.3-12 MP compressed to 1-4 bits per pixel, as camera photos are, and grayscale document
pages near the processor's ``max_pixels``). Each payload runs the recipe's graph (``vlm_sft``: reader ->
mapper -> CostAnnotator -> Windower -> BalanceExchange (-> RowProcessor) -> MicroBatchAssembler) on its own
spawned ranks, ``language=dp=2`` + ``images=dp=2``, reordering on, overlap on, an idle trainer (the loop only
takes micro-batches). Per rank it records:

- bytes moved per window: what the rank sent in the exchange's all_to_all (the exchange's own records);
- peak host memory of prefetched windows: the bytes of the windows the exchange holds ahead of the consumer
  plus, with rows, the windows RowProcessor processed ahead (a sampler thread every 5 ms), and the peak RSS;
- processing CPU: thread CPU seconds inside the processing calls (with samples the processor before the
  exchange; with rows the counting before it and the module's processing after it);
- throughput: micro-batches per second after the first, and the time from building the graph to the first.

    python benchmarks/exchange_payload.py [--data embedded,photos] [--steps 24] [--photos 48]
        [--max-pixels N] [--num-workers 2] [--out DIR] [--no-docs]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _dist  # noqa: E402  (benchmarks/_dist.py)

MARKER = "exchange_payload.py results"
COMPONENTS = ("language=dp=2", "images=dp=2,rank_offset=2")
PAYLOADS = ("rows", "samples")


# ----------------------------------------------------------------------------------------------------
# The realistic set


def _photo(rng: Any, megapixels: float, bits_per_pixel: float) -> tuple[bytes, int, int]:
    """A smooth random scene with sensor-like grain, JPEG-compressed to about ``bits_per_pixel``."""
    import numpy as np
    from PIL import Image

    aspect = rng.choice([4 / 3, 3 / 2, 16 / 9, 1.0, 3 / 4, 2 / 3])
    width = int(math.sqrt(megapixels * 1e6 * aspect))
    height = int(megapixels * 1e6 / width)
    coarse = Image.fromarray(rng.integers(0, 255, (max(height // 64, 2), max(width // 64, 2), 3), dtype=np.uint8))
    scene = np.asarray(coarse.resize((width, height), Image.BICUBIC), dtype=np.int16)
    scene += rng.normal(0, 6, (height, width, 1)).astype(np.int16)  # grain that JPEG has to spend bits on
    image = Image.fromarray(np.clip(scene, 0, 255).astype(np.uint8))
    low, high, best = 5, 98, b""
    for _ in range(6):  # bisection on the quality for the bit rate
        quality = (low + high) // 2
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=quality)
        best = buffer.getvalue()
        if 8 * len(best) / (width * height) > bits_per_pixel:
            high = quality - 1
        else:
            low = quality + 1
    return best, height, width


def _page(rng: Any, pixels: int) -> bytes:
    """A grayscale scanned page of about ``pixels`` pixels: lines of dark strokes standing in for text."""
    import numpy as np
    from PIL import Image, ImageDraw

    width = int(math.sqrt(pixels / 1.414))
    height = int(pixels / width)
    page = Image.new("L", (width, height), 245)
    draw = ImageDraw.Draw(page)
    for y in range(height // 20, height - height // 20, max(height // 60, 12)):
        x = width // 12
        while x < width - width // 12:
            word = int(rng.integers(width // 60, width // 12))
            draw.rectangle([x, y, x + word, y + max(height // 150, 4)], fill=int(rng.integers(20, 90)))
            x += word + width // 80
    noisy = np.asarray(page, dtype=np.int16) + rng.normal(0, 3, (height, width)).astype(np.int16)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buffer, format="JPEG", quality=80)
    return buffer.getvalue()


def realistic_set(folder: Path, count: int, max_pixels: int, seed: int = 0) -> Path:
    """Three photos for each document page; built once into ``folder`` (a save_to_disk dataset)."""
    import datasets
    import numpy as np

    if (folder / "dataset_info.json").is_file():
        return folder
    rng = np.random.default_rng(seed)
    rows = []
    for index in range(count):
        if index % 4 == 3:
            data = _page(rng, int(max_pixels * rng.uniform(0.85, 1.0)))
            prompt, response = "Read the page.", "The page lists the terms of the agreement in order."
        else:
            megapixels = float(math.exp(rng.uniform(math.log(0.3), math.log(12.0))))
            data, _, _ = _photo(rng, megapixels, float(rng.uniform(1.0, 4.0)))
            prompt, response = "What is in the picture?", "A street with trees and a few parked cars."
        rows.append({"prompt": prompt, "response": response, "images": [{"bytes": data, "path": None}]})
    features = datasets.Features({"prompt": datasets.Value("string"), "response": datasets.Value("string"),
                                  "images": datasets.List(datasets.Image())})
    datasets.Dataset.from_list(rows, features=features).save_to_disk(str(folder))
    return folder


def processor_folder(folder: Path, max_pixels: int) -> Path:
    """The built-in processor with another ``max_pixels`` (the same tokenizer and patches)."""
    from transformers import Qwen2VLImageProcessorPil

    from mimo_pipes.data.embedded.builtin_processor import MERGE_SIZE, MIN_PIXELS, PATCH_SIZE, TEMPORAL_PATCH_SIZE, build_tokenizer

    if not (folder / "preprocessor_config.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        build_tokenizer().save_pretrained(str(folder))
        Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=max_pixels, patch_size=PATCH_SIZE,
                                 temporal_patch_size=TEMPORAL_PATCH_SIZE, merge_size=MERGE_SIZE).save_pretrained(str(folder))
    return folder


# ----------------------------------------------------------------------------------------------------
# One rank


class Timed:
    """A processing function that adds up the CPU time of its calls (each on its worker thread)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.seconds = 0.0
        self.lock = threading.Lock()

    def __call__(self, row: Any) -> Any:
        started = time.thread_time()
        try:
            return self.fn(row)
        finally:
            spent = time.thread_time() - started
            with self.lock:
                self.seconds += spent


class Sampler(threading.Thread):
    """Every 5 ms: the bytes of the windows held ahead of the consumer (exchanged; processed ahead)."""

    def __init__(self, exchange: Any, processor: Any) -> None:
        super().__init__(name="benchmark-sampler", daemon=True)
        self.exchange, self.processor = exchange, processor
        self.done = threading.Event()
        self.peak_exchanged = self.peak_processed = self.peak_total = 0

    def run(self) -> None:
        from mimo_pipes.samples.sample import held_bytes

        while not self.done.wait(0.005):  # errors end the run: a sampler that stopped would under-report
            exchanged = sum(held_bytes(window) for window in self.exchange.prefetched_windows())
            processed = sum(held_bytes(window) for window in self.processor.processed_ahead()) if self.processor else 0
            self.peak_exchanged = max(self.peak_exchanged, exchanged)
            self.peak_processed = max(self.peak_processed, processed)
            self.peak_total = max(self.peak_total, exchanged + processed)


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def rank_main(rank: int, world_size: int, case: dict[str, Any]) -> dict[str, Any]:
    from mimo_pipes.cli.rank.setup import set_up_rank
    from mimo_pipes.config import PipelineConfig, ReorderConfig
    from mimo_pipes.data.processing.module_processor import ModuleProcessor
    from mimo_pipes.data.processing.row_counter import RowCounter
    from mimo_pipes.data.sources.open_source import open_source
    from mimo_pipes.nodes import RowProcessor
    from mimo_pipes.observe.observer import ExchangeRecord
    from mimo_pipes.samples.module_fields import module_fields
    from mimo_pipes_recipes import vlm_sft

    config = PipelineConfig(
        components=COMPONENTS, micro_batch_size=4, seq_length=case["seq_length"], dataset=case["dataset"],
        processor=case["processor"], num_workers=case["num_workers"], exchange_payload=case["payload"], seed=5,
        reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True),
    )
    setup = set_up_rank(config)
    assert setup is not None
    layout = setup.layout
    started = time.perf_counter()
    processor = vlm_sft.open_processor(config)
    dataset = open_source(config.dataset)
    if case["payload"] == "rows":
        fields = module_fields(layout.module)
        map_fn, process_rows = Timed(RowCounter(processor, fields).count), Timed(ModuleProcessor(processor, fields))
    else:
        map_fn, process_rows = Timed(processor), None
    loader = vlm_sft.pipeline(dataset, config, layout, map_fn=map_fn, image_token_id=processor.placeholder_ids,
                              pad_values={"input_ids": processor.pad_token_id, "labels": -100},
                              vision_fields=processor.vision_fields, process_rows=process_rows)
    exchange = loader.exchange_node()
    row_processor = next((node for node in _nodes(loader) if isinstance(node, RowProcessor)), None)
    records: list[ExchangeRecord] = []
    exchange.add_observer(records.append)
    sampler = Sampler(exchange, row_processor)
    sampler.start()
    image_tokens = 0
    batch = next(loader)
    first = time.perf_counter()
    image_tokens += sum(batch["image_tokens"])
    for _ in range(case["steps"] - 1):
        image_tokens += sum(next(loader)["image_tokens"])
    last = time.perf_counter()
    sampler.done.set()
    sampler.join()
    loader.close()
    consumed = [record for record in records if record.first_step < case["steps"]]
    return {
        "module": setup.position.module.name,
        "dp_rank": setup.position.dp_rank,
        "bytes_sent_per_window": statistics.mean(record.bytes_sent for record in consumed),
        "window_bytes": statistics.mean(record.window_bytes for record in consumed),
        "prefetched_exchanged": sampler.peak_exchanged,
        "prefetched_processed": sampler.peak_processed,
        "prefetched_total": sampler.peak_total,
        "peak_rss": peak_rss_bytes(),
        "processing_cpu_s": map_fn.seconds + (process_rows.seconds if process_rows is not None else 0.0),
        "image_tokens": image_tokens,
        "first_microbatch_s": first - started,
        "microbatches_per_s": (case["steps"] - 1) / (last - first) if last > first else float("nan"),
    }


def _nodes(loader: Any) -> list[Any]:
    from mimo_pipes.graph.traversal import graph_nodes

    return graph_nodes(loader.root)


# ----------------------------------------------------------------------------------------------------
# Summary


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    language = [r for r in results if r["module"] == "language"]
    images = [r for r in results if r["module"] == "images"]

    def mean(rows: list[dict], key: str) -> float:
        return statistics.mean(r[key] for r in rows)

    cpu = [r["processing_cpu_s"] for r in images]
    tokens = [r["image_tokens"] for r in images]
    return {
        "bytes_per_window": {"language": mean(language, "bytes_sent_per_window"), "images": mean(images, "bytes_sent_per_window")},
        "window_bytes": {"language": mean(language, "window_bytes"), "images": mean(images, "window_bytes")},
        "prefetched": {module: {key: max(r[f"prefetched_{key}"] for r in rows) for key in ("exchanged", "processed", "total")}
                       for module, rows in (("language", language), ("images", images))},
        "peak_rss": {"language": max(r["peak_rss"] for r in language), "images": max(r["peak_rss"] for r in images)},
        "cpu_language_s": mean(language, "processing_cpu_s"),
        "cpu_images_max_s": max(cpu),
        "cpu_images_mean_s": statistics.mean(cpu),
        "cpu_images_max_over_mean": max(cpu) / statistics.mean(cpu),
        "tokens_images_max_over_mean": max(tokens) / statistics.mean(tokens),
        "microbatches_per_s": min(r["microbatches_per_s"] for r in results),
        "first_microbatch_s": max(r["first_microbatch_s"] for r in results),
    }


def median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round of median throughput (its figures kept together), with every round's throughput."""
    ordered = sorted(rounds, key=lambda r: r["microbatches_per_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["rounds_microbatches_per_s"] = [r["microbatches_per_s"] for r in rounds]
    return chosen


def mb(value: float) -> str:
    return f"{value / 1e6:.3f}" if value < 1e7 else f"{value / 1e6:.0f}"


def render(runs: dict[str, dict[str, dict[str, Any]]], info: dict[str, Any], args: argparse.Namespace, sets: dict[str, str]) -> str:
    lines = _dist.provenance_lines(_dist.command_line(), info)
    lines += [f"Data: {'; '.join(f'{name}: {text}' for name, text in sets.items())}. Layout `{' + '.join(COMPONENTS)}`, "
              f"micro-batch 4, window 1, overlap on, {args.num_workers} processing threads per rank, {args.steps} "
              f"micro-batches (the realistic set: all of its rows), idle trainer; of {args.rounds} alternating rounds per payload, "
              "the one of median throughput.", ""]
    header = ("| data | payload | MB sent per window, language / images rank | MB an exchanged window holds, language / images "
              "| peak MB held ahead (exchanged + processed), language / images | peak RSS MB, language / images | processing "
              "CPU s, language rank | encoder ranks: CPU s max / mean (max/mean; image tokens max/mean) | micro-batches/s "
              "(every round) | first micro-batch s |")
    lines += [header, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, by_payload in runs.items():
        for payload in PAYLOADS:
            s = by_payload[payload]
            pre = s["prefetched"]
            lines.append(
                f"| {name} | {payload} | {mb(s['bytes_per_window']['language'])} / {mb(s['bytes_per_window']['images'])} | "
                f"{mb(s['window_bytes']['language'])} / {mb(s['window_bytes']['images'])} | "
                f"{mb(pre['language']['total'])} ({mb(pre['language']['exchanged'])} + {mb(pre['language']['processed'])}) / "
                f"{mb(pre['images']['total'])} ({mb(pre['images']['exchanged'])} + {mb(pre['images']['processed'])}) | "
                f"{s['peak_rss']['language'] / 1e6:.0f} / {s['peak_rss']['images'] / 1e6:.0f} | {s['cpu_language_s']:.2f} | "
                f"{s['cpu_images_max_s']:.2f} / {s['cpu_images_mean_s']:.2f} ({s['cpu_images_max_over_mean']:.3f}; "
                f"{s['tokens_images_max_over_mean']:.3f}) | {s['microbatches_per_s']:.2f} "
                f"({', '.join(f'{v:.2f}' for v in s['rounds_microbatches_per_s'])}) | {s['first_microbatch_s']:.1f} |"
            )
    lines += ["", "Ratios, samples over rows:", ""]
    for name, by_payload in runs.items():
        rows, samples = by_payload["rows"], by_payload["samples"]
        lines.append(
            f"- {name}: bytes per window {samples['bytes_per_window']['language'] / rows['bytes_per_window']['language']:.0f}x "
            f"(language), {samples['bytes_per_window']['images'] / rows['bytes_per_window']['images']:.0f}x (images); "
            f"an exchanged window {samples['window_bytes']['language'] / rows['window_bytes']['language']:.0f}x (language), "
            f"{samples['window_bytes']['images'] / rows['window_bytes']['images']:.0f}x (images); peak exchanged windows held "
            f"{_ratio(samples, rows, 'exchanged')}; peak of all held ahead {_ratio(samples, rows, 'total')}; "
            f"language processing CPU {samples['cpu_language_s'] / rows['cpu_language_s']:.0f}x; throughput rows/samples "
            f"{rows['microbatches_per_s'] / samples['microbatches_per_s']:.2f}x"
        )
    return "\n".join(lines)


def _ratio(samples: dict, rows: dict, key: str) -> str:
    parts = []
    for module in ("language", "images"):
        low = rows["prefetched"][module][key]
        parts.append(f"{samples['prefetched'][module][key] / low:.0f}x ({module})" if low else f"{module}: none held with rows")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="embedded,photos", help="comma-separated: embedded, photos")
    parser.add_argument("--steps", type=int, default=24, help="micro-batches of the embedded data per payload")
    parser.add_argument("--photos", type=int, default=48, help="rows of the realistic set (a quarter document pages)")
    parser.add_argument("--max-pixels", type=int, default=None,
                        help="the processor's max_pixels (default: the built-in processor's, 1280 x 28 x 28)")
    parser.add_argument("--num-workers", type=int, default=2, help="processing threads per rank")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each payload, alternating; the median round is reported")
    parser.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "mimo-pipes", "benchmarks"),
                        help="where the realistic set and processor folder are built once")
    parser.add_argument("--out", default=None, help="also write the results as JSON into this folder")
    parser.add_argument("--no-docs", action="store_true", help="do not write the results into docs/benchmarks.md")
    args = parser.parse_args()

    from mimo_pipes.data.embedded.builtin_dataset import default_dataset_path
    from mimo_pipes.data.embedded.builtin_processor import MAX_PIXELS, default_processor_path

    info = _dist.machine()
    max_pixels = args.max_pixels or MAX_PIXELS
    cache = Path(args.cache)
    processor = str(default_processor_path() if args.max_pixels is None else processor_folder(cache / f"processor-{max_pixels}", max_pixels))
    seq_length = max(2048, max_pixels // 784 + 512)
    cases, sets = {}, {}
    for name in args.data.split(","):
        if name == "embedded":
            cases[name] = (str(default_dataset_path(512, seed=0)), args.steps)
            sets[name] = "the embedded data (512 rows)"
        elif name == "photos":
            folder = realistic_set(cache / f"photos-{args.photos}-{max_pixels}", args.photos, max_pixels)
            cases[name] = (str(folder), args.photos // 4)
            sets[name] = (f"{args.photos} rows, three JPEG photos (0.3-12 MP, 1-4 bits per pixel) to one grayscale page "
                          f"near max_pixels {max_pixels}")
        else:
            raise SystemExit(f"--data: unknown data set {name!r}")
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    for name, (dataset, steps) in cases.items():
        rounds: dict[str, list[dict[str, Any]]] = {payload: [] for payload in PAYLOADS}
        for round_index in range(args.rounds):
            for payload in PAYLOADS:  # alternating, so that the machine's load falls on both alike
                case = {"dataset": dataset, "processor": processor, "payload": payload, "steps": steps,
                        "num_workers": args.num_workers, "seq_length": seq_length}
                print(f"{name}, {payload}, round {round_index + 1}: {steps} micro-batches on 4 ranks ...", flush=True)
                results = _dist.run_ranks(rank_main, 4, (case,), timeout_s=3000)
                assert results is not None
                rounds[payload].append(summarize(results))
                print(json.dumps(rounds[payload][-1]), flush=True)
        runs[name] = {payload: median_round(rounds[payload]) for payload in PAYLOADS}
    body = render(runs, info, args, sets)
    print(body)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "exchange_payload.json"), "w") as handle:
            json.dump({"machine": info, "runs": runs}, handle, indent=1)
    if not args.no_docs:
        _dist.write_results(MARKER, body)


if __name__ == "__main__":
    main()
