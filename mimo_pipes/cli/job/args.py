"""The flags ``run``, ``analyze`` and ``train`` share, and the configuration they make."""

from __future__ import annotations

import argparse

from mimo_pipes.cli.commands.argtypes import path
from mimo_pipes.config import DATALOADER_TYPES, DEFAULT_COMPONENTS, EXCHANGE_PAYLOADS, EXCHANGE_TRANSPORTS, LANGUAGE_COSTS, PipelineConfig, ReorderConfig
from mimo_pipes.config.job_options import JobOptions
from mimo_pipes.config.processing import PROCESSING_SETTINGS


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def add_seq_length_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seq-length", type=int, default=PipelineConfig.seq_length,
                        help="tokens per sample: the processor truncates to it, and micro-batches are padded to it")


def add_data_arguments(parser: argparse.ArgumentParser, *, dataset_required: bool = False) -> None:
    """``--dataset``, ``--processor``, ``--image-folder``: where the rows come from and how they are read."""
    sources = ("a datasets save_to_disk folder, .parquet / .json / .jsonl files or a quoted glob of them (LLaVA "
               "annotation lists included), or a prepared Megatron-Energon dataset folder or metadataset .yaml")
    if dataset_required:
        parser.add_argument("--dataset", type=path, required=True, help=sources)
    else:
        parser.add_argument("--dataset", type=path, default=None, help=f"{sources} (default: the embedded synthetic data)")
    parser.add_argument("--processor", type=path, default=None,
                        help="a saved processor folder: its tokenizer, image processor and chat template make the samples "
                             "(default: the embedded offline processor)")
    parser.add_argument("--image-folder", type=path, default=None, metavar="DIR",
                        help="folder that the data's image and video paths resolve inside; a path outside it is a bad row "
                             "(default: the dataset's own folder; refused with an Energon dataset, whose images are in its shards)")
    parser.add_argument("--split-part", default=PipelineConfig.split_part, metavar="{train,val,test}",
                        help="the split part of a Megatron-Energon dataset or metadataset to read, as its split.yaml or "
                             "metadataset names it; sample k is the k-th of that part's shards in split.yaml's order")


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of a job: data, layout, batching, reordering, what to consume, checkpoints, output.
    Every flag says what it does; the formatter appends its default (see cli/commands/help_format.py)."""
    defaults = PipelineConfig()
    reorder = ReorderConfig()
    _add_layout_arguments(parser, defaults)
    _add_reorder_arguments(parser, reorder)
    _add_packing_arguments(parser, defaults, reorder)
    _add_reading_arguments(parser, defaults)
    _add_exchange_arguments(parser, defaults)
    _add_output_arguments(parser)


def _add_layout_arguments(parser: argparse.ArgumentParser, defaults: PipelineConfig) -> None:
    """The modules' layout and the batches."""
    parser.add_argument("--component", action="append", metavar="SPEC",
                        help="a module and its parallel layout, repeatable: 'language=tp=1,pp=1,dp=2,rank_offset=0' "
                             "(keys tp, cp, pp, dp, etp, rank_offset; one module must be named language) "
                             "(default: language=dp=2 + images=dp=2,rank_offset=2)")
    parser.add_argument("--micro-batch-size", type=int, default=defaults.micro_batch_size,
                        help="samples per global micro-batch, over all DP ranks of a module")
    parser.add_argument("--global-batch-size", type=int, default=None,
                        help="samples per global batch; with --reorder-across-microbatches a window never crosses "
                             "one (default: one window of micro-batches)")
    add_seq_length_argument(parser)
    parser.add_argument("--pad-to-seq-length", type=_bool, default=True, metavar="{true,false}",
                        help="pad every micro-batch to --seq-length; false pads to its longest sample")


def _add_reorder_arguments(parser: argparse.ArgumentParser, reorder: ReorderConfig) -> None:
    """Reordering: what is balanced, over how many micro-batches, on which cost."""
    parser.add_argument("--scalable-dp", action="store_true",
                        help="each rank reads only its canonical shard, never the whole global micro-batch")
    parser.add_argument("--intra-microbatch-reorder", action="store_true",
                        help="balance the vision load of every micro-batch (window) over each module's DP ranks "
                             "(needs --scalable-dp)")
    parser.add_argument("--reorder-encoder-cost-weight", default=str(reorder.reorder_encoder_cost_weight),
                        help="weight of a sample's image tokens in its cost (only the ratio of the weights matters)")
    parser.add_argument("--reorder-language-cost-weight", default=str(reorder.reorder_language_cost_weight),
                        help="weight of a sample's real tokens in its cost")
    parser.add_argument("--no-overlap-intra-microbatch-reorder", action="store_true",
                        help="exchange on the training thread instead of prefetching on a background thread")
    parser.add_argument("--reorder-window-size", type=int, default=reorder.reorder_window_size,
                        help="micro-batches balanced in one exchange")
    parser.add_argument("--reorder-across-microbatches", action="store_true",
                        help="let samples move between the micro-batches of a window (opt-in)")
    parser.add_argument("--reorder-cost-model", type=path, metavar="PATH", default=None,
                        help="balance on a vision encoder's modelled time: a JSON file written by "
                             "'mimo-pipes calibrate' (default: none, a cost linear in image tokens)")
    parser.add_argument("--reorder-two-level", action="store_true",
                        help="when language dp is k > 1 times the encoder dp: split samples over encoder replicas by "
                             "encoder cost, then each replica's k language slots by real tokens")


def _add_packing_arguments(parser: argparse.ArgumentParser, defaults: PipelineConfig, reorder: ReorderConfig) -> None:
    """Sequence packing (THD) and the language cost it implies."""
    parser.add_argument("--pack-sequences-in-batch", action="store_true",
                        help="pack each rank's micro-batch into one THD row after reordering: real tokens "
                             "concatenated, cu_seqlens, no attention mask")
    parser.add_argument("--pack-pad-multiple", type=int, default=defaults.pack_pad_multiple, metavar="K",
                        help="with packing, pad every sequence to a multiple of this; 2 x cp for context "
                             "parallelism")
    parser.add_argument("--reorder-language-cost", choices=LANGUAGE_COSTS, default=reorder.reorder_language_cost,
                        help="language term of a sample's cost: tokens = real tokens L; packed = L + L^2 / "
                             "--reorder-attention-crossover, a packed rank's linear plus attention work")
    parser.add_argument("--reorder-attention-crossover", type=int, default=reorder.reorder_attention_crossover,
                        metavar="TOKENS",
                        help="with --reorder-language-cost packed: the sequence length at which attention work "
                             "equals the linear layers' work, about 12 x hidden size for a causal decoder")


def _add_reading_arguments(parser: argparse.ArgumentParser, defaults: PipelineConfig) -> None:
    """What is read, in which order, how far, and how rows are processed."""
    parser.add_argument("--dataloader-type", default=defaults.dataloader_type,
                        help=f"{' or '.join(DATALOADER_TYPES)}: read the data once, or start a new shuffled "
                             "epoch when it ends")
    parser.add_argument("--drop-last", type=_bool, default=True, metavar="{true}",
                        help="drop the samples that do not fill a last global micro-batch (true is the only value: "
                             "scalable data parallelism needs full global micro-batches)")
    parser.add_argument("--steps", type=int, default=JobOptions.steps,
                        help="global micro-batches to consume (counted from the start of training)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the epoch shuffle")
    add_data_arguments(parser)
    parser.add_argument("--skip-bad-samples", action="store_true",
                        help="replace a row that cannot be processed (corrupt or missing image, no text, images longer "
                             "than --seq-length) by the next good row of the global order, count and report it; without it such "
                             "a row stops the run with an error naming it")
    parser.add_argument("--embedded-samples", type=int, default=defaults.embedded_samples,
                        help="size of the embedded synthetic dataset (without --dataset)")
    parser.add_argument("--num-workers", type=int, default=defaults.num_workers,
                        help="processing workers per rank (default: the cores a rank may use, shared among the node's "
                             "ranks, less 2 for its own threads)")
    parser.add_argument("--processing", choices=PROCESSING_SETTINGS, default=defaults.processing,
                        help="where the workers process samples: worker processes (process), threads of the rank "
                             "(thread), or auto: processes when a rank has 2 workers or more and they can start, "
                             "else threads; the samples are the same")
    parser.add_argument("--read-ahead", type=int, default=defaults.read_ahead, metavar="N",
                        help="whole micro-batches each rank's loader makes ahead of the training thread on a thread of its "
                             "own (0: none); a saved state is always at the last micro-batch handed out")


def _add_exchange_arguments(parser: argparse.ArgumentParser, defaults: PipelineConfig) -> None:
    """How the exchange moves samples between ranks."""
    parser.add_argument("--exchange-transport", default=defaults.exchange_transport,
                        help=f"{', '.join(EXCHANGE_TRANSPORTS)}: gloo moves bytes on the CPU, nccl through the GPU; "
                             "auto takes nccl only for an exchange on the training thread of a GPU run")
    parser.add_argument("--exchange-payload", choices=EXCHANGE_PAYLOADS, default=defaults.exchange_payload,
                        help="what the exchange moves: rows = dataset rows (text, images as encoded bytes), processed "
                             "after it on the rank that trains on them, each module making only its own fields; "
                             "samples = samples processed where they were read (the micro-batches are the same)")
    parser.add_argument("--exchange-image-paths", action="store_true",
                        help="with --exchange-payload rows, rows move their images' paths, not the files' bytes "
                             "(every rank must read the same files, under the same --image-folder)")
    parser.add_argument("--exchange-timeout", type=float, default=defaults.exchange_timeout_s,
                        help="seconds before a collective gives up on a silent peer")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Checkpoints, the recipe, and what the job writes and prints."""
    parser.add_argument("--dump-assignments", type=path, metavar="DIR", default=None,
                        help="write DIR/rank{N}.jsonl, one line per micro-batch a rank consumes (default: no dump)")
    parser.add_argument("--stop-after", type=int, default=None, metavar="K",
                        help="stop after K micro-batches and save the state to --save-state (default: run to --steps)")
    parser.add_argument("--save-state", type=path, metavar="DIR", default=None,
                        help="save a complete state of every rank here when the run ends: after --steps, after "
                             "--stop-after K, or at the next micro-batch boundary after SIGTERM / SIGINT (default: none)")
    parser.add_argument("--resume", type=path, metavar="DIR", default=None,
                        help="continue from a state saved with --save-state, up to --steps (default: start afresh)")
    parser.add_argument("--recipe", type=path, default=JobOptions.recipe,
                        help="recipe that builds each rank's graph: an importable module or a .py file providing "
                             "prepare(config, log) and build(config, layout) (see mimo_pipes.cli.job.recipe)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no metrics lines")
    # Exchange metrics (see docs/metrics.md); they come from the exchange, so they need reordering on.
    parser.add_argument("--tensorboard", type=path, metavar="DIR", default=None,
                        help="write every window's exchange metrics as TensorBoard scalars to DIR/<module>/ "
                             "(DP rank 0 of each module; needs --intra-microbatch-reorder) (default: off)")
    parser.add_argument("--log-interval", type=int, default=JobOptions.log_interval, metavar="N",
                        help="print cumulative exchange metrics every N windows (rank 0's module, above the progress bar) "
                             "and at the end (every module) (0: only at the end; none with --quiet)")


def config_from_args(args: argparse.Namespace) -> tuple[PipelineConfig, JobOptions]:
    reorder = ReorderConfig(
        scalable_dp=args.scalable_dp,
        intra_microbatch_reorder=args.intra_microbatch_reorder,
        reorder_encoder_cost_weight=args.reorder_encoder_cost_weight,
        reorder_language_cost_weight=args.reorder_language_cost_weight,
        overlap_intra_microbatch_reorder=not args.no_overlap_intra_microbatch_reorder,
        reorder_window_size=args.reorder_window_size,
        reorder_across_microbatches=args.reorder_across_microbatches,
        reorder_language_cost=args.reorder_language_cost,
        reorder_attention_crossover=args.reorder_attention_crossover,
        reorder_cost_model=args.reorder_cost_model,
        reorder_two_level=args.reorder_two_level,
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
        processing=args.processing,
        read_ahead=args.read_ahead,
        exchange_transport=args.exchange_transport,
        exchange_timeout_s=args.exchange_timeout,
        reorder=reorder,
        pack_sequences_in_batch=args.pack_sequences_in_batch,
        pack_pad_multiple=args.pack_pad_multiple,
        image_folder=args.image_folder,
        split_part=args.split_part,
        skip_bad_samples=args.skip_bad_samples,
        exchange_payload=args.exchange_payload,
        exchange_image_paths=args.exchange_image_paths,
    )
    options = JobOptions(
        steps=args.steps,
        recipe=args.recipe,
        dump_assignments=args.dump_assignments,
        stop_after=args.stop_after,
        save_state=args.save_state,
        resume=args.resume,
        progress=not args.quiet,
        tensorboard=args.tensorboard,
        log_interval=args.log_interval,
        summary_json=getattr(args, "summary_json", None),
    )
    return config, options
