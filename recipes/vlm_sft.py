"""Recipe: a Qwen2-VL-style SFT graph for one module rank of a non-colocated MIMO run.

Every module builds the same graph from the same data; only its DP layout differs. Copy this file to
build your own (``--recipe path/to/your_recipe.py``): it provides what the commands call (see
:mod:`mimo_pipes.cli.job.recipe`): :func:`prepare` before any rank starts, :func:`build` on every rank, and
:func:`row_counts` for ``mimo-pipes analyze``. :func:`pipeline` writes the reader and the processing
mappers, then appends the library's tail (costs, windows, the exchange, micro-batches) with
:func:`~mimo_pipes.graph.tail.balanced_tail`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torchdata.nodes import BaseNode, Mapper, ParallelMapper

from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.counts import as_count
from mimo_pipes.config.processing import check_processing, processing_method
from mimo_pipes.config.tail_settings import resolve_pipeline_tail
from mimo_pipes.config.transport import check_read_ahead
from mimo_pipes.config.workers import counting_workers, processing_workers
from mimo_pipes.data.bad_rows.skipping import SkipBadRows
from mimo_pipes.data.from_config import dataset_path, image_folder, open_processor, processor_path
from mimo_pipes.data.processing.module_processor import ModuleProcessor
from mimo_pipes.data.processing.processor import check_processor_path
from mimo_pipes.data.processing.row_counter import RowCounter
from mimo_pipes.data.sources.open_source import check_source, open_source, report_problems
from mimo_pipes.data.storage.s3_images import prefetch_media, prefetch_rows
from mimo_pipes.data.storage.s3_url import is_s3
from mimo_pipes.errors import ConfigError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.graph.tail import balanced_tail
from mimo_pipes.graph.torchdata_guards import start_workers_from
from mimo_pipes.nodes import CanonicalShardReader, SnapshotGuard
from mimo_pipes.nodes.canonical_shard_reader import MapStyleDataset
from mimo_pipes.nodes.media_prefetch import MediaPrefetch
from mimo_pipes.observe.warning_tally import WarningsRecorded, replayed
from mimo_pipes.samples.collate import FieldSpec
from mimo_pipes.samples.module_fields import module_fields
from mimo_pipes.samples.sample import Sample
from mimo_pipes.samples.worker_start import worker_context


def pipeline(
    dataset: MapStyleDataset,
    config: PipelineConfig,
    layout: RankLayout,
    *,
    map_fn: Callable[[Sample], Sample] | None,
    image_token_id: int | tuple[int, ...],
    pad_values: Mapping[str, int | float],
    vision_fields: Mapping[str, FieldSpec] | None = None,
    consumed_microbatches: int = 0,
    processing: str | None = None,
    process_rows: Callable[[Sample], Sample] | None = None,
    stand_in: Callable[[Sample], Sample] | None = None,
) -> GraphLoader:
    """This rank's loader over ``dataset``.

    With ``process_rows`` the exchange moves rows (``--exchange-payload rows``): ``map_fn`` counts each
    row before it (its cost from the text and the image headers), ``process_rows`` makes it this module's
    sample after it, on the rank that trains on it. Without, ``map_fn`` turns rows into processed samples
    of unpadded tensors (None: the dataset holds them already) and those move. ``stand_in``: under rows with
    ``--skip-bad-samples``, what this module trains on in place of a row that fails after the exchange
    (the row is masked on every module: mimo_pipes/samples/masking.py).
    ``consumed_microbatches`` resumes from a Megatron-style count alone: the same stream as restoring
    the loader's full state. ``image_token_id``: the placeholder ids the cost counts (image and video);
    ``vision_fields``: the vision fields every micro-batch carries, empty when no sample has them.
    ``processing``: ``auto``, ``thread`` or ``process`` (worker processes: what they run must pickle); None: the
    config's (:mod:`mimo_pipes.config.processing`)."""
    setting = config.processing if processing is None else processing
    check_processing(setting)
    # The workers run the processing: after the exchange with rows (process_rows), else the map function; with rows
    # the counting (the map function) runs on processes too (below): what they run must pickle, both.
    work = tuple(function for function in (process_rows, map_fn) if function is not None)
    # Nothing to process (the dataset holds processed samples): no worker starts, whatever the setting.
    method = processing_method(setting, processing_workers(config.num_workers), work=work) if work else "thread"
    tail = resolve_pipeline_tail(
        config, layout.dp_size, image_token_ids=image_token_id, pad_values=pad_values, vision_fields=vision_fields,
        module=layout.module, method=method,
        payload="rows" if process_rows is not None else "samples",
    )
    # This rank's B/d samples of every global micro-batch, from the window that holds the next one.
    node: BaseNode[Any] = CanonicalShardReader(
        dataset,
        micro_batch_size=config.micro_batch_size,
        dp_rank=layout.dp_rank,
        dp_size=layout.dp_size,
        grid_size=layout.grid_size,
        seed=config.seed,
        dataloader_type=config.dataloader_type,
    )
    if map_fn is not None:
        folder = image_folder(config)
        # With rows, images named by path in object storage are counted on threads: they read the cache MediaPrefetch fills.
        method = "thread" if tail.processing.rows and is_s3(folder) else tail.processing.method
        if is_s3(folder) and method == "thread":
            # Images named by path in object storage: each row's files fetched as it is read, ahead of the mappers,
            # on the store's own pool (its concurrency, not the mappers'), into the cache the mappers read.
            node = MediaPrefetch(node, start=functools.partial(prefetch_media, image_folder=folder), ahead=prefetch_rows())
        # Processing, or with rows the counting (cheap: a worker per WORKERS_PER_COUNTING_WORKER; on processes it
        # leaves the rank's interpreter lock to the training thread). ParallelMapper keeps its source's state as
        # snapshots without copying: SnapshotGuard hands it copies.
        workers = counting_workers(tail.processing.workers) if tail.processing.rows else tail.processing.workers
        if method == "process":
            # Warnings raised on the worker processes are recorded there and counted on this rank (its run summary).
            node = ParallelMapper(SnapshotGuard(node), WarningsRecorded(map_fn), num_workers=workers, in_order=True, method=method)
            start_workers_from(node, worker_context())  # from the library's worker server (torchdata would fork this process)
            node = Mapper(node, replayed)
        else:
            node = ParallelMapper(SnapshotGuard(node), map_fn, num_workers=workers, in_order=True, method=method)
    # CostAnnotator -> Windower -> BalanceExchange -> (RowProcessor ->) MicroBatchAssembler (-> SequencePacker).
    tail_node = balanced_tail(node, settings=tail, layout=layout, process_rows=process_rows, stand_in=stand_in)
    # Whole micro-batches made ahead of the training thread on the loader's own thread (--read-ahead).
    read_ahead = check_read_ahead(config.read_ahead, exchange_on_gpu=layout.exchange_device is not None, exchanges=tail.plan.reorder)
    return GraphLoader(tail_node, consumed_microbatches=consumed_microbatches, read_ahead=read_ahead)


def prepare(config: PipelineConfig, log: Callable[[str], None] = print) -> None:
    """Check user paths, and build the embedded data and processor once before the ranks start. What the
    ranks open anyway is opened here only where opening checks something (the user's data and processor,
    a time model against the processor's patches): loading the embedded ones added seconds before any rank
    started, and their sizes are settings checked already."""
    if config.dataset is not None:
        check_source(config.dataset, config.split_part)
    else:
        log(f"embedded dataset: {config.embedded_samples} synthetic VLM samples")
        dataset_path(config)  # built once, here, not by every rank at once
    if config.processor is not None:
        check_processor_path(config.processor)
    if config.processor is not None or config.reorder.reorder_cost_model is not None:
        open_processor(config)
    log(f"processor: {processor_path(config)}")
    if config.dataset is not None:
        dataset = open_source(config.dataset, config.split_part)
        report_problems(dataset, skip_bad=config.skip_bad_samples, log=log)  # a shard that cannot be read: said once, here
        if len(dataset) < config.micro_batch_size:
            raise ConfigError("--dataset", f"{len(dataset)} samples are fewer than one micro-batch of {config.micro_batch_size}")


def build(
    config: PipelineConfig, layout: RankLayout, *, consumed_microbatches: int = 0, processing: str | None = None
) -> GraphLoader:
    """This rank's loader; ``consumed_microbatches`` resumes from a Megatron-style count; ``processing``:
    per-sample processing on ``thread``s, worker ``process``es or ``auto`` (None: ``config.processing``). A count
    that is not an integer >= 0 is refused here."""
    consumed_microbatches = as_count(consumed_microbatches, "consumed_microbatches")
    processor = open_processor(config)
    dataset = open_source(dataset_path(config), config.split_part)
    rows: ModuleProcessor | None = None
    map_fn: Callable[[Sample], Sample] = processor
    if config.exchange_payload == "rows":
        # Rows move, counted from their text and image headers; each module processes its own fields after the exchange.
        # Under --skip-bad-samples every module also refuses image files that are not whole, before the exchange:
        # a row that would fail only where it is decoded is replaced alike on every module (data/bad_rows/complete_files.py);
        # one that fails there all the same (its compressed data corrupt) is masked on every module (samples/masking.py).
        fields = module_fields(layout.module)
        map_fn = RowCounter(processor, fields, image_paths=config.exchange_image_paths, whole_files=config.skip_bad_samples).count
        rows = ModuleProcessor(processor, fields)
    if config.skip_bad_samples:
        map_fn = SkipBadRows(map_fn, dataset, micro_batch_size=config.micro_batch_size, seed=config.seed,
                             dataloader_type=config.dataloader_type)
    return pipeline(
        dataset,
        config,
        layout,
        map_fn=map_fn,
        image_token_id=processor.placeholder_ids,
        pad_values={"input_ids": processor.pad_token_id, "labels": -100},
        vision_fields=processor.vision_fields,
        consumed_microbatches=consumed_microbatches,
        processing=processing,
        process_rows=rows,
        stand_in=rows.stand_in if rows is not None else None,
    )


def row_counts(config: PipelineConfig, *, real_tokens: bool, runs: bool, progress: Callable[[str, int], Callable[[int], None]] | None = None) -> Any:
    """Every row's image tokens, real tokens and (with ``runs``) placeholder runs, as :func:`build`'s graph
    would count them: the same source, image folder and processor (for ``mimo-pipes analyze``); with
    ``--skip-bad-samples`` the rows that cannot be counted are listed in ``bad_rows``, not raised.
    ``progress(description, total)`` returns the callback that takes the rows done."""
    from mimo_pipes.analysis.row_counts import count_rows

    dataset = open_source(dataset_path(config), config.split_part)
    tick = progress("costs", len(dataset)) if progress is not None else None
    # Under the samples payload the graph processes every row whole before counting it: a row bad only when its
    # images are decoded is replaced there, so with --skip-bad-samples the count decodes them too.
    decode = config.skip_bad_samples and config.exchange_payload == "samples"
    # Under the rows payload the graph refuses image files that are not whole before counting (build above).
    whole_files = config.skip_bad_samples and config.exchange_payload == "rows"
    return count_rows(dataset, open_processor(config), real_tokens=real_tokens, runs=runs, progress=tick, skip_bad=config.skip_bad_samples,
                      decode=decode, whole_files=whole_files)


def failed_after_exchange(config: PipelineConfig, rows: Iterable[int], progress: Callable[[int], None] | None = None) -> dict[int, str]:
    """Under ``--exchange-payload rows`` with ``--skip-bad-samples``: each of ``rows`` that :func:`build`'s graph
    would count, move and then fail to process (an image file whole by its framing whose pixels cannot be
    decoded), with why; the run masks those (mimo_pipes/samples/masking.py). For ``mimo-pipes analyze``, on the
    rows it consumes: each is processed whole, as an encoder module processes it after the exchange."""
    from mimo_pipes.errors import SampleError, row_reason
    from mimo_pipes.samples.module_fields import ENCODER, ModuleFields
    from mimo_pipes.samples.sample import SAMPLE_ID

    dataset = open_source(dataset_path(config), config.split_part)
    # The encoder module's path of a row, as build() makes it: counted (files read as the exchange moves them),
    # then processed; a row that fails there is masked on every module.
    processor, fields = open_processor(config), ModuleFields(ENCODER)
    counter = RowCounter(processor, fields, image_paths=config.exchange_image_paths, whole_files=True)
    encoder = ModuleProcessor(processor, fields)
    failed: dict[int, str] = {}
    for row in rows:
        try:
            encoder(counter.count({**dataset[row], SAMPLE_ID: row}))
        except SampleError as error:
            failed[row] = row_reason(error)
        if progress is not None:
            progress(1)
    return failed
