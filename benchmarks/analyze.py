"""How long `mimo-pipes analyze` takes on a large dataset: token counts (uncached and cached) and the replay.

The dataset is the embedded synthetic one repeated to ``--samples`` rows (memory-mapped, nothing
copied), so its image sizes, text lengths and mix are those of the embedded data. Prints markdown
for docs/benchmarks.md.

    python benchmarks/analyze.py --samples 100000
    python benchmarks/analyze.py --samples 2048 --base 48   # smoke
    python benchmarks/analyze.py --samples 100000 --time-model benchmarks/results/h200-qwen2-vl-675m-time-model.json
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _dist  # noqa: E402  (benchmarks/_dist.py)

from mimo_pipes.analysis.analyze import analyze  # noqa: E402
from mimo_pipes.analysis.row_counts import count_rows  # noqa: E402
from mimo_pipes.config import PipelineConfig, ReorderConfig  # noqa: E402
from mimo_pipes.data.cache import CACHE_ENV  # noqa: E402
from mimo_pipes.data.embedded.builtin_dataset import default_dataset_path  # noqa: E402
from mimo_pipes.data.embedded.builtin_processor import default_processor_path  # noqa: E402
from mimo_pipes.data.processing.processor import load_processor  # noqa: E402
from mimo_pipes.data.sources.saved_folder import open_dataset  # noqa: E402


def repeated_dataset(base: int, samples: int):
    import datasets

    one = open_dataset(default_dataset_path(base, seed=0))
    copies = -(-samples // len(one))
    return datasets.concatenate_datasets([one] * copies).select(range(samples))


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the replay's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--base", type=int, default=512, help="embedded dataset size that is repeated")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--time-model", metavar="PATH", default=None,
                        help="replay --reorder-cost-model PATH: counts also find each row's placeholder runs (default: token cost)")
    args = parser.parse_args()
    info = _dist.machine()
    processor = load_processor(default_processor_path(), 2048)
    dataset = repeated_dataset(args.base, args.samples)
    reorder = ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_cost_model=args.time_model)
    config = PipelineConfig(micro_batch_size=args.micro_batch_size, reorder=reorder)
    topology = config.validate()
    model = reorder.load_time_model()
    steps = args.samples // args.micro_batch_size
    with tempfile.TemporaryDirectory() as cache:
        os.environ[CACHE_ENV] = cache  # an empty cache: the first count is a cold one
        started, cpu = time.perf_counter(), _cpu()
        counts = count_rows(dataset, processor, real_tokens=False, runs=model is not None)  # as the CLI does for a vision-only cost
        cold, cold_cpu = time.perf_counter() - started, _cpu() - cpu
        started = time.perf_counter()
        count_rows(dataset, processor, real_tokens=False, runs=model is not None)
        warm = time.perf_counter() - started
    started, cpu = time.perf_counter(), _cpu()
    encoder_costs = counts.encoder_costs(model) if model is not None else None
    result = analyze(config, topology, counts.image_tokens, counts.real_tokens, start=0, stop=steps, encoder_costs=encoder_costs)
    replay, replay_cpu = time.perf_counter() - started, _cpu() - cpu
    figures = result.figures["images"]
    print(f"### `mimo-pipes analyze` on {args.samples} samples")
    print("\n".join(_dist.provenance_lines(_dist.command_line(), info)))
    print("| part | wall s | CPU s (all processes) |")
    print("|---|---|---|")
    runs = ", placeholder runs" if model is not None else ""
    print(f"| token counts{runs}, cold cache ({args.samples} rows, image headers + resize rule) | {cold:.1f} | {cold_cpu:.1f} |")
    print(f"| token counts, cached | {warm:.2f} | |")
    priced = "modelled encoder ns, " if model is not None else ""
    print(f"| replay: {priced}given setting, no reorder, per micro-batch, across windows 2, 4, 8, bounds ({steps} micro-batches) | {replay:.1f} | {replay_cpu:.1f} |")
    print(f"| total, cold cache | {cold + replay:.1f} | {cold_cpu + replay_cpu:.1f} |")
    print()
    print(f"Default layout, micro-batch {args.micro_batch_size}, window 1: images spread {figures['spread_before']:.1f} -> "
          f"{figures['spread_after']:.1f}, critical path {figures['critical_path_before']} -> {figures['critical_path_after']} "
          f"(lower bound {figures['critical_path_lower_bound']['per_microbatch']}).")


if __name__ == "__main__":
    main()
