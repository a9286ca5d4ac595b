"""``mimo-pipes analyze``: what reordering would do for a run's flags, offline, in one process.

Takes ``mimo-pipes run``'s flags (so ``run`` can be swapped for ``analyze`` on one command line) plus
``--out DIR``. Every flag is one of three kinds (tests hold every flag of ``run`` to one): honoured with
run's meaning (:data:`HONOURED`: what decides the micro-batches consumed, ``--skip-bad-samples`` and
``--exchange-payload`` included), accepted and ignored because it changes no sample's place (:data:`IGNORED`,
each saying so in its help, with run's checks still applied), or refused as not applying (:data:`REFUSED`).
Rows are counted by the recipe (``row_counts``), as its graph would count them, and a line says how many had
to be processed to be counted (no header gave their sizes) and why.
Writes ``DIR/analysis.json`` and one PNG per module.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mimo_pipes.cli.commands.argtypes import path, positive_ints
from mimo_pipes.cli.job.args import add_job_arguments, config_from_args
from mimo_pipes.cli.job.checks import check_job
from mimo_pipes.cli.job.headline import headline
from mimo_pipes.cli.job.launcher import EXIT_CONFIG, EXIT_FAILED
from mimo_pipes.cli.job.output_paths import check_output_folder
from mimo_pipes.config import PipelineConfig
from mimo_pipes.errors import ConfigError, SampleError

RESULT_FILE = "analysis.json"

HONOURED = (
    "--component", "--micro-batch-size", "--global-batch-size", "--seq-length", "--scalable-dp", "--intra-microbatch-reorder",
    "--reorder-encoder-cost-weight", "--reorder-language-cost-weight", "--reorder-window-size", "--reorder-across-microbatches",
    "--reorder-cost-model", "--reorder-two-level", "--reorder-language-cost", "--reorder-attention-crossover", "--dataloader-type",
    "--drop-last", "--steps", "--seed", "--dataset", "--processor", "--image-folder", "--split-part", "--skip-bad-samples", "--embedded-samples",
    "--exchange-payload", "--stop-after", "--resume", "--recipe", "--quiet",
)
"""Flags of ``run`` that mean to analyze what they mean to run. ``--exchange-payload`` decides which rows
``--skip-bad-samples`` replaces: under ``samples`` a row whose image fails only when decoded is bad, so its
images are decoded then; ``--quiet``: no progress bar."""
IGNORED = {
    "--pad-to-seq-length": "padding moves no sample; its checks apply",
    "--no-overlap-intra-microbatch-reorder": "which thread exchanges; the micro-batches are the same",
    "--pack-sequences-in-batch": "packing comes after the exchange and moves no sample; its checks apply",
    "--pack-pad-multiple": "packing comes after the exchange and moves no sample; its checks apply",
    "--num-workers": "processing workers of a rank; analyze counts in one process",
    "--processing": "where a rank's workers process samples, not which; analyze counts in one process",
    "--exchange-transport": "how the bytes travel, not which",
    "--exchange-image-paths": "how rows travel, not which",
    "--exchange-timeout": "analyze runs no collective",
    "--read-ahead": "how far a loader makes micro-batches ahead, not which",
    "--dump-assignments": "analyze writes no dump; DIR/analysis.json holds its figures",
    "--save-state": "analyze saves no state; --stop-after still needs it, as in run",
    "--tensorboard": "analyze writes no exchange metrics; its checks apply",
    "--log-interval": "analyze prints no metrics lines",
}
"""Flags of ``run`` that analyze accepts so that a run's command line works unchanged, and ignores: each
changes no sample's place (its help says so)."""
REFUSED = {"--summary-json": "analyze writes its figures to DIR/analysis.json (--out)"}
"""Flags of ``run`` that do not apply to analyze: given, they are refused with exit 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Offline, in one process: what reordering would do for a run's flags. Counts every row as the run's "
        "graph would, replays the micro-batches the run would consume, and writes DIR/analysis.json (spread "
        "and critical path per module, what-ifs for other windows, lower bounds) and one PNG per module."
    )
    add_job_arguments(parser)
    for action in parser._actions:  # each ignored flag says so in its help
        flag = action.option_strings[0] if action.option_strings else None
        if flag in IGNORED:
            action.help = f"analyze: accepted and ignored ({IGNORED[flag]}). run: {action.help}"
    for flag, why in REFUSED.items():
        parser.add_argument(flag, dest=f"refused_{flag.lstrip('-').replace('-', '_')}", default=None, metavar="...",
                            help=f"run only; refused here: {why} (default: not given)")
    parser.add_argument("--out", type=path, required=True, metavar="DIR", help="folder for analysis.json and the PNG plots")
    parser.add_argument("--compare-window-sizes", type=positive_ints, default=(2, 4, 8), metavar="W,W,...",
                        help="across-micro-batch window sizes to report besides the given settings (default: 2,4,8)")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="write DIR/analysis.json and the tables only, no PNG (drawing them takes a second or more; "
                             "for scripts that read the JSON)")


def _progress_factory(enabled: bool):
    def make(description: str, total: int):
        if not enabled:
            return lambda _done: None
        from tqdm import tqdm

        # leave=True: the bar ends with its line, so the report after it starts a line of its own in a shared log
        bar = tqdm(total=total, desc=description, file=sys.stderr, dynamic_ncols=True, leave=True)

        def update(done: int) -> None:
            bar.update(done)
            if bar.n >= total:
                bar.close()

        return update

    return make


def analysis_mode(config: PipelineConfig, time_model: bool) -> str:
    """The replayed settings, as the headline and the plots' titles say them (transport and overlap play no part)."""
    reorder = config.reorder
    if not reorder.intra_microbatch_reorder:
        return "reorder off"
    return (f"reorder on (window {reorder.reorder_window_size}{', across micro-batches' if reorder.reorder_across_microbatches else ''}"
            f"{', time model' if time_model else ''}{', two-level' if reorder.reorder_two_level else ''})")


def _masked_rows(recipe: Any, config: PipelineConfig, result: Any, topology: Any, progress: Any) -> str | None:
    """The run's line of rows masked after the exchange (rows payload): the consumed rows the recipe says fail
    where they are processed, masked alike on every module. None where the run prints none or the recipe
    cannot say (no ``failed_after_exchange``)."""
    find = getattr(recipe, "failed_after_exchange", None)
    if config.exchange_payload != "rows" or not callable(find):
        return None
    from mimo_pipes.observe.bad_rows_report import format_mask_report
    from mimo_pipes.observe.warning_tally import collected

    consumed = sorted(set(result.replay.after.reshape(-1).tolist()))
    with collected():  # the count met every consumed row already: its warnings are said once, from there
        failed = dict(sorted(find(config, consumed, progress("processed", len(consumed))).items()))
    return format_mask_report(failed, {module.name: sorted(failed) for module in topology.modules})


def _windows_a_run_takes(config: PipelineConfig, sizes: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The what-if windows (across micro-batches) a run would take with these settings, and those it refuses:
    with --global-batch-size set, a window must divide the micro-batches of a global batch."""
    if config.global_batch_size is None:
        return tuple(sizes), ()
    per_global = config.microbatches_per_global_batch
    return tuple(w for w in sizes if per_global % w == 0), tuple(w for w in sizes if per_global % w)


def run(args: argparse.Namespace) -> int:
    from mimo_pipes.analysis.analyze import analyze, write_plots
    from mimo_pipes.analysis.table import format_analysis
    from mimo_pipes.cli.job.recipe import load_recipe
    from mimo_pipes.observe.warning_tally import collected, merge

    try:
        for flag, why in REFUSED.items():
            if getattr(args, f"refused_{flag.lstrip('-').replace('-', '_')}", None) is not None:
                raise ConfigError(flag, f"does not apply to analyze: {why}")
        config, options = config_from_args(args)
        topology, start = check_job(config, options)  # every check of run, the ignored flags' included
        config.check_cost_range(topology, max(config.reorder.reorder_window_size, *args.compare_window_sizes))  # the what-ifs' windows
        check_output_folder(args.out, "--out")
        recipe = load_recipe(options.recipe, needs=("row_counts",), command="analyze")
        if callable(getattr(recipe, "prepare", None)):
            recipe.prepare(config, log=lambda message: print(message, file=sys.stderr, flush=True))
    except ConfigError as error:
        print(f"mimo-pipes analyze: error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    progress = _progress_factory(options.progress)
    stop = options.stop_after if options.stop_after is not None else options.steps
    compared, refused = _windows_a_run_takes(config, args.compare_window_sizes)
    if refused:
        print(f"mimo-pipes analyze: across {', '.join(map(str, refused))} left out: with --global-batch-size "
              f"{config.global_batch_size} a run refuses windows that do not divide the {config.microbatches_per_global_batch} "
              "micro-batches of a global batch", file=sys.stderr)
    reorder = config.reorder
    model = reorder.load_time_model()
    try:
        wants_real_tokens = reorder.integer_cost_weights()[1] > 0 or reorder.reorder_two_level  # two levels split on them
        with collected() as tally:  # one line per kind below the tables (rows read from the counts' cache say none)
            counts = recipe.row_counts(config, real_tokens=wants_real_tokens, runs=model is not None, progress=progress)
            warnings = merge([tally.snapshot()])
    except SampleError as error:
        print(f"mimo-pipes analyze: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    image_tokens = counts.image_tokens
    bad_rows = getattr(counts, "bad_rows", None) if config.skip_bad_samples else None  # a recipe's own counts may list none
    try:
        result = analyze(config, topology, image_tokens, counts.real_tokens, start=start, stop=stop,
                         encoder_costs=counts.encoder_costs(model) if model is not None else None,
                         compare_window_sizes=compared, progress=progress, bad_rows=bad_rows)
    except ConfigError as error:  # counts beyond what --seq-length allows (a recipe's own counter)
        print(f"mimo-pipes analyze: error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except SampleError as error:  # --skip-bad-samples: a bad row followed by MAX_TRIES bad ones, as the run stops
        print(f"mimo-pipes analyze: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT_FILE).write_text(json.dumps(result.figures, indent=1) + "\n")
    end = int(result.replay.steps[-1]) + 1 if len(result.replay.steps) else start
    mode = analysis_mode(config, model is not None)
    plots = []
    if args.plots:
        plots = write_plots(out, result, topology, f"micro-batch {config.micro_batch_size}, micro-batches {start}..{end - 1}, {mode}")
    print(headline(config, topology, start, end, command="mimo-pipes analyze", mode=mode))
    if end < stop:  # as the run says it
        print(f"the data ended after {end} micro-batches, before the {stop} asked for "
              f"({'--stop-after' if options.stop_after is not None else '--steps'})")
    print(format_analysis(result))
    if config.skip_bad_samples:
        from mimo_pipes.analysis.analyze import skipped_rows
        from mimo_pipes.observe.bad_rows_report import format_skip_report

        print(format_skip_report(*skipped_rows(result)))
        masked = _masked_rows(recipe, config, result, topology, progress)
        if masked is not None:
            print(masked)
    for count in warnings:
        print(count.line())
    processed = getattr(counts, "processed_for_cost", None)  # a recipe's own counts may not say
    if processed is not None:
        from mimo_pipes.data.processing.row_counter import cost_line

        print(cost_line(processed, len(image_tokens), counts.processed_reasons))
    print(f"wrote {', '.join(map(str, [out / RESULT_FILE, *plots]))}")
    return 0
