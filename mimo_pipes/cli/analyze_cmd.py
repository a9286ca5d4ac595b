"""``mimo-pipes analyze``: what reordering would do for a run's flags, offline, in one process.

Takes ``mimo-pipes run``'s flags (so ``run`` can be swapped for ``analyze`` on one command line) plus
``--out DIR``. Flags that change what a run consumes are honoured (data, layout, batch, seed, dataloader
type, window, cost weights, --steps, --stop-after, --resume); the others (transport, overlap, workers,
--dump-assignments, --save-state) are accepted and ignored. Writes ``DIR/analysis.json`` and one PNG
per module.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mimo_pipes.cli import run_cmd
from mimo_pipes.cli.argtypes import positive_ints
from mimo_pipes.config import JobOptions
from mimo_pipes.errors import ConfigError, SampleError

RESULT_FILE = "analysis.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_cmd.add_arguments(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for analysis.json and the PNG plots")
    parser.add_argument("--compare-window-sizes", type=positive_ints, default=(2, 4, 8), metavar="W,W,...",
                        help="across-micro-batch window sizes to report besides the given settings (default: 2,4,8)")


def _progress_factory(enabled: bool):
    def make(description: str, total: int):
        if not enabled:
            return lambda _done: None
        from tqdm import tqdm

        bar = tqdm(total=total, desc=description, file=sys.stderr, dynamic_ncols=True, leave=False)

        def update(done: int) -> None:
            bar.update(done)
            if bar.n >= total:
                bar.close()

        return update

    return make


def _refuse_unmodelled(config) -> None:
    """Settings whose planning analyze does not replay: refused, never silently predicted wrong."""
    reorder = config.reorder
    if reorder.reorder_cost_model is not None:
        raise ConfigError("--reorder-cost-model", "analyze replays token costs only; a calibrated time model needs each "
                          "image's token count per row, which analyze does not keep yet")
    if reorder.reorder_two_level:
        raise ConfigError("--reorder-two-level", "analyze does not replay two-level balancing yet")


def run(args: argparse.Namespace) -> int:
    from mimo_pipes.analysis.analyze import analyze, write_plots
    from mimo_pipes.analysis.costs import count_tokens
    from mimo_pipes.data.dataset import open_dataset
    from mimo_pipes.data.processor import load_processor
    from mimo_pipes_recipes.vlm_sft import dataset_path, prepare, processor_path

    try:
        config, options = run_cmd.config_from_args(args)
        topology = config.validate()
        if options.recipe != JobOptions.recipe:
            raise ConfigError("--recipe", f"analyze replays the built-in recipe ({JobOptions.recipe}) only, got {options.recipe}")
        start = run_cmd.validate_consumption(config, options, topology.world_size)
        _refuse_unmodelled(config)
        prepare(config, log=lambda message: print(message, file=sys.stderr, flush=True))
        dataset = open_dataset(dataset_path(config))
        processor = load_processor(processor_path(config), config.seq_length)
    except ConfigError as error:
        print(f"mimo-pipes analyze: error: {error}", file=sys.stderr)
        return run_cmd.EXIT_CONFIG
    progress = _progress_factory(options.progress)
    stop = options.stop_after if options.stop_after is not None else options.steps
    try:
        language_weight = config.reorder.integer_cost_weights()[1]
        image_tokens, real_tokens = count_tokens(dataset, processor, real_tokens=language_weight > 0, progress=progress("costs", len(dataset)))
    except SampleError as error:
        print(f"mimo-pipes analyze: error: {error}", file=sys.stderr)
        return run_cmd.EXIT_FAILED
    result = analyze(config, topology, image_tokens, real_tokens, start=start, stop=stop,
                     compare_window_sizes=args.compare_window_sizes, progress=progress)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT_FILE).write_text(json.dumps(result.figures, indent=1) + "\n")
    reorder = config.reorder
    mode = (f"reorder on, window {reorder.reorder_window_size}{', across micro-batches' if reorder.reorder_across_microbatches else ''}"
            if reorder.intra_microbatch_reorder else "reorder off")
    write_plots(out, result, image_tokens, topology, f"micro-batch {config.micro_batch_size}, steps {start}..{stop - 1}, {mode}")
    for name, figures in result.figures.items():
        print(f"{name:<10} dp={figures['dp_size']} steps={figures['steps']} spread {figures['spread_before']:.1f} -> "
              f"{figures['spread_after']:.1f}, critical path {figures['critical_path_before']} -> {figures['critical_path_after']}")
    print(f"wrote {out / RESULT_FILE} and {len(topology.modules)} plot(s)")
    return 0
