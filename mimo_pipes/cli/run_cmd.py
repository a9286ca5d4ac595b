"""``mimo-pipes run``: the main job, on locally spawned ranks or under torchrun.

Flags follow the Megatron-Bridge Qwen3.5-VL example. Every setting is checked before any rank starts;
a bad one ends the command with one line that names it (exit 2), never a traceback.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from mimo_pipes.config import (
    DATALOADER_TYPES,
    DEFAULT_COMPONENTS,
    EXCHANGE_TRANSPORTS,
    JobOptions,
    PipelineConfig,
    ReorderConfig,
    resolve_exchange_transport,
)
from mimo_pipes.errors import ConfigError, PeerError, SampleError

EXIT_CONFIG = 2
EXIT_FAILED = 1


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = PipelineConfig()
    reorder = ReorderConfig()
    parser.add_argument("--component", action="append", metavar="SPEC",
                        help="module spec, repeatable: 'language=tp=1,pp=1,dp=2,rank_offset=0' "
                             "(default: language=dp=2 + images=dp=2)")
    parser.add_argument("--micro-batch-size", type=int, default=defaults.micro_batch_size,
                        help="samples per global micro-batch, over all DP ranks of a module")
    parser.add_argument("--global-batch-size", type=int, default=None,
                        help="samples per global batch (default: one window of micro-batches)")
    parser.add_argument("--seq-length", type=int, default=defaults.seq_length)
    parser.add_argument("--pad-to-seq-length", type=_bool, default=True, metavar="{true,false}")
    parser.add_argument("--scalable-dp", action="store_true", help="each rank reads only its canonical shard")
    parser.add_argument("--intra-microbatch-reorder", action="store_true", help="balance vision load across DP ranks")
    parser.add_argument("--reorder-encoder-cost-weight", default=str(reorder.reorder_encoder_cost_weight))
    parser.add_argument("--reorder-language-cost-weight", default=str(reorder.reorder_language_cost_weight))
    parser.add_argument("--no-overlap-intra-microbatch-reorder", action="store_true",
                        help="exchange on the training thread instead of a background thread")
    parser.add_argument("--reorder-window-size", type=int, default=reorder.reorder_window_size)
    parser.add_argument("--reorder-across-microbatches", action="store_true",
                        help="let samples move between the micro-batches of a window")
    parser.add_argument("--dataloader-type", default=defaults.dataloader_type, help=f"{' or '.join(DATALOADER_TYPES)}")
    parser.add_argument("--drop-last", type=_bool, default=True, metavar="{true,false}")
    parser.add_argument("--steps", type=int, default=JobOptions.steps, help="global micro-batches to consume")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--dataset", default=None,
                        help="a datasets save_to_disk folder, or .parquet / .json / .jsonl files or a quoted glob of "
                             "them, LLaVA annotation lists included (default: embedded data)")
    parser.add_argument("--processor", default=None, help="a saved processor folder (default: embedded processor)")
    parser.add_argument("--image-folder", default=None, metavar="DIR",
                        help="folder that relative image paths in --dataset are resolved against (default: as given)")
    parser.add_argument("--skip-bad-samples", action="store_true",
                        help="replace a row that cannot be processed (corrupt or missing image, no text, images longer "
                             "than --seq-length) by the next good row of its slot, count and report it (default: "
                             "off: such a row stops the run with an error naming it)")
    parser.add_argument("--embedded-samples", type=int, default=defaults.embedded_samples,
                        help="size of the embedded synthetic dataset")
    parser.add_argument("--num-workers", type=int, default=defaults.num_workers, help="processing threads per rank")
    parser.add_argument("--exchange-transport", default=defaults.exchange_transport,
                        help=f"{', '.join(EXCHANGE_TRANSPORTS)}: gloo moves bytes on the CPU")
    parser.add_argument("--exchange-timeout", type=float, default=defaults.exchange_timeout_s,
                        help="seconds before a collective gives up on a silent peer")
    parser.add_argument("--dump-assignments", metavar="DIR", default=None)
    parser.add_argument("--stop-after", type=int, default=None, metavar="K")
    parser.add_argument("--save-state", metavar="DIR", default=None)
    parser.add_argument("--resume", metavar="DIR", default=None)
    parser.add_argument("--recipe", default=JobOptions.recipe, help="module with build(config, layout) -> loader")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def config_from_args(args: argparse.Namespace) -> tuple[PipelineConfig, JobOptions]:
    reorder = ReorderConfig(
        scalable_dp=args.scalable_dp,
        intra_microbatch_reorder=args.intra_microbatch_reorder,
        reorder_encoder_cost_weight=args.reorder_encoder_cost_weight,
        reorder_language_cost_weight=args.reorder_language_cost_weight,
        overlap_intra_microbatch_reorder=not args.no_overlap_intra_microbatch_reorder,
        reorder_window_size=args.reorder_window_size,
        reorder_across_microbatches=args.reorder_across_microbatches,
    )
    config = PipelineConfig(
        components=tuple(args.component) if args.component else DEFAULT_COMPONENTS,
        micro_batch_size=args.micro_batch_size,
        global_batch_size=args.global_batch_size,
        seq_length=args.seq_length,
        pad_to_seq_length=args.pad_to_seq_length,
        dataloader_type=args.dataloader_type,
        drop_last=args.drop_last,
        seed=args.seed,
        dataset=args.dataset,
        processor=args.processor,
        embedded_samples=args.embedded_samples,
        num_workers=args.num_workers,
        exchange_transport=args.exchange_transport,
        exchange_timeout_s=args.exchange_timeout,
        reorder=reorder,
        image_folder=args.image_folder,
        skip_bad_samples=args.skip_bad_samples,
    )
    options = JobOptions(
        steps=args.steps,
        recipe=args.recipe,
        dump_assignments=args.dump_assignments,
        stop_after=args.stop_after,
        save_state=args.save_state,
        resume=args.resume,
        progress=not args.quiet,
    )
    return config, options


def validate_job(config: PipelineConfig, options: JobOptions) -> int:
    """All checks that can run before a rank starts; returns the world size."""
    from mimo_pipes.cli.job import check_resume_dir, world_backend  # imports torch: only for `run`

    topology = config.validate()
    if config.reorder.intra_microbatch_reorder:
        resolve_exchange_transport(
            config.exchange_transport,
            world_backend(topology.world_size),
            config.reorder.overlap_intra_microbatch_reorder,
            os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
        )
    if options.steps < 1:
        raise ConfigError("--steps", f"must be >= 1, got {options.steps}")
    if config.embedded_samples < config.micro_batch_size and config.dataset is None:
        raise ConfigError("--embedded-samples", f"{config.embedded_samples} is fewer than one micro-batch")
    if (options.stop_after is None) != (options.save_state is None):
        raise ConfigError("--stop-after" if options.stop_after is None else "--save-state",
                          "--stop-after K and --save-state DIR go together")
    if options.stop_after is not None and not 1 <= options.stop_after <= options.steps:
        raise ConfigError("--stop-after", f"must be between 1 and --steps ({options.steps}), got {options.stop_after}")
    if options.resume is not None:
        consumed = check_resume_dir(options.resume, config, topology.world_size)
        if consumed >= options.steps:
            raise ConfigError("--steps", f"{options.steps} is not past the {consumed} micro-batches already consumed in {options.resume}")
        if options.stop_after is not None and options.stop_after <= consumed:
            raise ConfigError("--stop-after", f"must be past the {consumed} micro-batches already consumed")
    return topology.world_size


def run(args: argparse.Namespace) -> int:
    try:
        config, options = config_from_args(args)
        world_size = validate_job(config, options)
    except ConfigError as error:
        print(f"mimo-pipes run: error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _run_under_torchrun(config, options, world_size)
    try:
        _prepare_embedded(config)
    except ConfigError as error:
        print(f"mimo-pipes run: error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    return _spawn(config, options, world_size)


def _prepare_embedded(config: PipelineConfig) -> None:
    """Build the embedded processor and dataset once, here, so the ranks only load them."""
    from mimo_pipes_recipes.vlm_sft import prepare

    started = time.monotonic()
    prepare(config, log=lambda message: print(message, file=sys.stderr, flush=True))
    elapsed = time.monotonic() - started
    if elapsed > 1:
        print(f"data and processor ready in {elapsed:.1f}s", file=sys.stderr, flush=True)


def _run_under_torchrun(config: PipelineConfig, options: JobOptions, world_size: int) -> int:
    if int(os.environ["WORLD_SIZE"]) != world_size:
        print(f"mimo-pipes run: error: --component: modules cover {world_size} ranks but torchrun started "
              f"{os.environ['WORLD_SIZE']}", file=sys.stderr)
        return EXIT_CONFIG
    return _rank_entry(int(os.environ["RANK"]), world_size, None, config, options)


def _rank_entry(rank: int, world_size: int, port: int | None, config: PipelineConfig, options: JobOptions) -> int:
    from mimo_pipes.cli.job import run_in_process_group

    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        run_in_process_group(rank, world_size, config, options)
        return 0
    except (ConfigError, SampleError, PeerError) as error:
        print(f"mimo-pipes run: rank {rank}: {error}", file=sys.stderr, flush=True)
    except Exception as error:  # noqa: BLE001 - one line per rank, then a non-zero exit
        print(f"mimo-pipes run: rank {rank}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        if os.environ.get("MIMO_PIPES_TRACEBACK"):
            raise
    return EXIT_FAILED


def _spawned(rank: int, world_size: int, port: int, config: PipelineConfig, options: JobOptions) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(_rank_entry(rank, world_size, port, config, options))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawn(config: PipelineConfig, options: JobOptions, world_size: int) -> int:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    port = _free_port()
    print(f"starting {world_size} ranks", file=sys.stderr, flush=True)
    processes = [
        context.Process(target=_spawned, args=(rank, world_size, port, config, options), name=f"rank{rank}")
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    failed_at: float | None = None
    while any(process.is_alive() for process in processes):
        time.sleep(0.2)
        if failed_at is None and any(process.exitcode not in (None, 0) for process in processes):
            failed_at = time.monotonic()
        # A failed rank makes its peers fail within the exchange timeout; past that, stop them.
        if failed_at is not None and time.monotonic() - failed_at > config.exchange_timeout_s + 30:
            for process in processes:
                if process.is_alive():
                    process.kill()
    codes = [process.exitcode for process in processes]
    if any(codes):
        bad = [rank for rank, code in enumerate(codes) if code]
        print(f"mimo-pipes run: failed on rank(s) {', '.join(map(str, bad))}", file=sys.stderr)
        return EXIT_FAILED
    return 0
