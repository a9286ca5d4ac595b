"""One balanced exchange of a window over a module's DP group: gather costs, plan, one ragged all_to_all.

The arithmetic lives in pure modules (``balance``, ``exchange.plan``, ``exchange.wire_format``); this file
only moves bytes. Every rank calls :func:`exchange_window` for the same window (or :func:`announce_end` when its
source is exhausted) so failures and ends are agreed on by all ranks instead of leaving a peer waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NoReturn

import torch
import torch.distributed as dist

from mimo_pipes.balance.assign import assign_window, composition_of
from mimo_pipes.balance.settings import PlannerSettings
from mimo_pipes.errors import ConsumedMismatchError, PeerError
from mimo_pipes.exchange.buffers import ExchangeBuffers, new_buffer
from mimo_pipes.exchange.context import ExchangeContext
from mimo_pipes.exchange.lost_peers import collective
from mimo_pipes.exchange.plan import ExchangePlan, permute_local, plan_exchange
from mimo_pipes.exchange.wire_format import SampleEncoding, decode_samples, sample_encoding
from mimo_pipes.observe.observer import ExchangeRecord
from mimo_pipes.samples.sample import COST, ENCODER_COST, IMAGE_TOKENS, REAL_TOKENS, Sample, Window

STATUS_OK, STATUS_FAILED, STATUS_END = 0, 1, 2
# Where a failure happened, as the failing rank's peers are told it.
DURING_EXCHANGE, AFTER_EXCHANGE = "during the balance exchange", "after the balance exchange"
# status, number of micro-batches, first step, window sequence number, and the micro-batch the rank's loader
# started or restored at (-1: not known), so ranks restored from different saves are refused at once
HEADER = 5
CONSUMED_AT = 4
# Gathered per sample, at these offsets: the planners' costs (cost; encoder cost and real tokens for two
# levels), packed bytes (plans the all_to_all), image tokens (metrics only: carried in the same row so that
# metrics cost no collective of their own).
COST_AT, ENCODER_COST_AT, REAL_TOKENS_AT, ENCODED_BYTES_AT, IMAGE_TOKENS_AT = range(5)
PER_SAMPLE = 5


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _gather_header(ctx: ExchangeContext, local: torch.Tensor) -> torch.Tensor:
    local = local.to(ctx.device) if ctx.device is not None else local
    rows = [torch.empty_like(local) for _ in range(ctx.dp_size)]
    with collective("all-gather of window costs"):
        dist.all_gather(rows, local, group=ctx.group)
    return torch.stack(rows).cpu()


def _agree(
    ctx: ExchangeContext,
    status: int,
    sequence: int,
    window: Window | None,
    error: BaseException | None,
    costs_sizes: list[int],
    stage: str = DURING_EXCHANGE,
    consumed_microbatches: int = -1,
) -> torch.Tensor:
    """All-gather status, window shape, start position and per-sample values (see ``PER_SAMPLE``); raise on
    every rank if any failed (naming the failing rank, its cause and where it failed: its ``stage``), or if
    the ranks started from different consumed micro-batches."""
    width = HEADER + PER_SAMPLE * ctx.window_size * ctx.samples_per_rank
    local = torch.full((width,), -1, dtype=torch.int64)
    local[0] = status
    local[3] = sequence
    local[CONSUMED_AT] = consumed_microbatches
    if window is not None:
        local[1] = len(window.microbatches)
        local[2] = window.first_step
        local[HEADER : HEADER + len(costs_sizes)] = torch.tensor(costs_sizes, dtype=torch.int64)
    gathered = _gather_header(ctx, local)
    statuses = gathered[:, 0].tolist()
    if STATUS_FAILED in statuses:
        messages: list[tuple[str, str] | None] = [None] * ctx.dp_size
        with collective("all-gather of error messages"):
            dist.all_gather_object(messages, None if error is None else (_describe(error), stage), group=ctx.group)
        failed = statuses.index(STATUS_FAILED)
        if error is not None:
            raise error
        said = messages[failed]
        description, where = said if said is not None else ("failed", stage)
        raise PeerError(_global_rank(ctx, failed), f"{description} ({where})")
    if len(set(statuses)) > 1:
        ended = [rank for rank, value in enumerate(statuses) if value == STATUS_END]
        raise PeerError(_global_rank(ctx, ended[0]), "its data ended while other ranks of the module still had data")
    consumed = gathered[:, CONSUMED_AT].tolist()
    if len({value for value in consumed if value >= 0}) > 1:
        raise ConsumedMismatchError({_global_rank(ctx, rank): value for rank, value in enumerate(consumed)})
    shapes = gathered[:, 1:CONSUMED_AT]  # micro-batches, first step, sequence: identical on every rank
    if (shapes != shapes[0]).any():
        raise PeerError(None, f"ranks are out of step (micro-batches, first step, sequence per rank: {shapes.tolist()})")
    return gathered


def _global_rank(ctx: ExchangeContext, dp_rank: int) -> int:
    if ctx.group is None:
        return dist.get_rank() if dist.is_initialized() else 0
    return dist.get_global_rank(ctx.group, dp_rank)


def announce_end(ctx: ExchangeContext, sequence: int) -> None:
    """Tell the module this rank's source is exhausted; raises if a peer disagrees or failed."""
    if ctx.dp_size > 1:
        _agree(ctx, STATUS_END, sequence, None, None, [])


def announce_failure(ctx: ExchangeContext, sequence: int, error: BaseException, stage: str = DURING_EXCHANGE) -> NoReturn:
    """Make a local failure an exception on every rank of the module, in place of exchange ``sequence``: a bad
    sample or a source error (``stage`` :data:`DURING_EXCHANGE`), or a failure after the exchange, in
    collation or processing (:data:`AFTER_EXCHANGE`), which the peers' message names."""
    if ctx.dp_size > 1:
        _agree(ctx, STATUS_FAILED, sequence, None, error, [], stage=stage)
    raise error


def local_costs_and_encodings(window: Window, need_layouts: bool) -> tuple[list[int], list[SampleEncoding | None]]:
    """Interleaved per local sample (cost, encoder cost, real tokens, packed bytes, image tokens), and the
    layouts (measured once, reused to pack).

    Laying out validates that every sample can be encoded, so a bad sample fails here, before any collective."""
    values: list[int] = []
    layouts: list[SampleEncoding | None] = []
    for microbatch in window.microbatches:
        for sample in microbatch:
            layout = sample_encoding(sample) if need_layouts else None
            layouts.append(layout)
            values.extend((int(sample[COST]), int(sample.get(ENCODER_COST, 0)), int(sample.get(REAL_TOKENS, 0))))
            values.append(layout.size if layout is not None else 0)
            values.append(int(sample.get(IMAGE_TOKENS) or 0))
    return values, layouts


def exchange_window(
    ctx: ExchangeContext,
    window: Window,
    sequence: int,
    buffers: ExchangeBuffers | None = None,
    validate: Callable[[list[Sample]], None] | None = None,
    record: ExchangeRecord | None = None,
    consumed_microbatches: int = -1,
    composition: list[list[int]] | None = None,
    copy: bool = False,
) -> Window:
    """Balance one window over the module's DP ranks and return this rank's samples in canonical order.

    With ``buffers`` the byte buffers are reused: the caller must copy the result out before its next
    exchange, or pass ``copy`` (received samples get storage of their own). ``validate``
    checks this rank's samples before anything is sent (what the caller's work on the result needs), so a
    bad sample fails on every rank at once. With ``record`` (see
    :mod:`mimo_pipes.observe.observer`) the exchange fills in what it did: the window's gathered figures, its
    assignment, phase times and bytes moved. ``consumed_microbatches``: where this rank's loader started or
    restored (see :data:`CONSUMED_AT`; -1: not known). ``composition``: which samples form each output
    micro-batch (flat indices per micro-batch, as :class:`~mimo_pipes.samples.sample.Window` records them) of a
    window restored inside, whose first micro-batches were consumed under it (perhaps on another layout):
    the planner's plan when it forms those micro-batches, else each of them balanced over the slots where
    it is. With samples moving between micro-batches the result records its composition."""
    clock = _Clock(record)
    try:
        if any(len(microbatch) != ctx.samples_per_rank for microbatch in window.microbatches):
            raise ValueError(f"window at step {window.first_step}: every micro-batch must hold {ctx.samples_per_rank} samples")
        if validate is not None:
            validate([sample for microbatch in window.microbatches for sample in microbatch])
        costs_sizes, layouts = local_costs_and_encodings(window, need_layouts=ctx.dp_size > 1)
    except Exception as error:  # noqa: BLE001 - forwarded to every rank, then re-raised here
        announce_failure(ctx, sequence, error)
    clock.lap("encoding")
    count = len(window.microbatches)
    local_samples = [sample for microbatch in window.microbatches for sample in microbatch]
    if ctx.dp_size == 1:
        # Nothing to exchange: a local permutation into canonical order, no collective.
        local = torch.tensor(costs_sizes, dtype=torch.int64).reshape(count, ctx.micro_batch_size, PER_SAMPLE)
        plan, chosen = _plan(ctx, local, record, composition)
        clock.lap("plan")
        result = Window(window.first_step, permute_local(local_samples, plan), composition=chosen)
        clock.lap("decode")
        return result
    gathered = _agree(ctx, STATUS_OK, sequence, window, None, costs_sizes, consumed_microbatches=consumed_microbatches)
    clock.lap("gather")
    # gathered[r] holds rank r's samples, micro-batch by micro-batch: reorder into canonical flat indices.
    width = PER_SAMPLE * count * ctx.samples_per_rank
    values = gathered[:, HEADER : HEADER + width].reshape(ctx.dp_size, count, ctx.samples_per_rank, PER_SAMPLE)
    canonical = values.permute(1, 0, 2, 3).reshape(count, ctx.micro_batch_size, PER_SAMPLE)
    plan, chosen = _plan(ctx, canonical, record, composition)
    clock.lap("plan")
    sizes = canonical[:, :, ENCODED_BYTES_AT].reshape(-1).tolist()
    by_flat = _move(ctx, plan, local_samples, layouts, sizes, buffers, clock, copy)
    result = Window(window.first_step, permute_local(by_flat, plan), composition=chosen)
    clock.lap("decode")
    return result


class _Clock:
    """Phase times of one exchange into its record (when there is one); laps add up, so a phase may run twice."""

    def __init__(self, record: ExchangeRecord | None) -> None:
        self.record = record
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        if self.record is not None:
            self.record.seconds[phase] = self.record.seconds.get(phase, 0.0) + now - self.last
        self.last = now


def _plan(
    ctx: ExchangeContext, values: torch.Tensor, record: ExchangeRecord | None, composition: list[list[int]] | None = None
) -> tuple[ExchangePlan, list[list[int]] | None]:
    """The assignment from (W, B, PER_SAMPLE) gathered values: one level on cost, or two levels; with a
    ``composition``, micro-batches holding exactly its samples. Returns the plan and, when samples may move
    between micro-batches, the window's composition."""
    across = ctx.across_microbatches
    costs = values[:, :, COST_AT].tolist()
    encoder = language = None
    if ctx.encoder_groups:
        encoder, language = values[:, :, ENCODER_COST_AT].tolist(), values[:, :, REAL_TOKENS_AT].tolist()
    assignment = assign_window(costs, grid_size=ctx.grid_size, across_microbatches=across, composition=composition,
                               planner=PlannerSettings(ctx.floor, ctx.encoder_groups), encoder_costs=encoder, language_costs=language)
    if record is not None:
        record.costs, record.assignment = costs, assignment
        record.encoded_bytes = values[:, :, ENCODED_BYTES_AT].tolist()  # zeros at DP 1: nothing is encoded
        record.image_tokens = values[:, :, IMAGE_TOKENS_AT].tolist()
    plan = plan_exchange(assignment, ctx.dp_rank, ctx.dp_size, ctx.grid_size, ctx.micro_batch_size)
    return plan, composition_of(assignment) if across or composition is not None else None


def _flat_index(ctx: ExchangeContext, local_position: int) -> int:
    microbatch, within = divmod(local_position, ctx.samples_per_rank)
    return microbatch * ctx.micro_batch_size + ctx.dp_rank * ctx.samples_per_rank + within


def _move(
    ctx: ExchangeContext,
    plan: ExchangePlan,
    local_samples: list[Sample],
    layouts: list[SampleEncoding | None],
    sizes: list[int],
    buffers: ExchangeBuffers | None,
    clock: _Clock,
    copy: bool = False,
) -> dict[int, Sample]:
    """The one ragged all_to_all: only samples that change rank are packed and sent."""
    flat = [_flat_index(ctx, position) for position in range(len(local_samples))]
    by_flat = dict(zip(flat, local_samples))
    if not plan.any_moves:  # identical on every rank: all of them skip the collective together
        return by_flat
    encoding_by_flat = dict(zip(flat, layouts))
    allocate = buffers.get if buffers is not None else new_buffer
    staged = ctx.device is not None  # NCCL: host bytes go through the GPU
    send_splits, recv_splits = plan.send_split_bytes(sizes), plan.recv_split_bytes(sizes)
    if clock.record is not None:
        clock.record.bytes_sent, clock.record.bytes_received = sum(send_splits), sum(recv_splits)
        clock.record.samples_sent = sum(len(chunk) for chunk in plan.send_indices)
        clock.record.samples_received = sum(len(chunk) for chunk in plan.recv_indices)
    send_buffer = allocate("send", sum(send_splits), pinned=staged)
    offset = 0
    for index in plan.send_order():
        offset = encoding_by_flat[index].write_into(send_buffer, offset)
    recv_buffer = allocate("recv", sum(recv_splits), pinned=staged)
    if not staged:
        clock.lap("encode")
        with collective("all_to_all of packed samples"):
            dist.all_to_all_single(recv_buffer, send_buffer, recv_splits, send_splits, group=ctx.group)
        clock.lap("all_to_all")
    else:  # NCCL: stage the bytes through the GPU
        send_device = allocate("send", send_buffer.numel(), ctx.device)
        send_device.copy_(send_buffer, non_blocking=send_buffer.is_pinned())  # the collective waits for it
        recv_device = allocate("recv", recv_buffer.numel(), ctx.device)
        clock.lap("encode")
        with collective("all_to_all of packed samples"):
            dist.all_to_all_single(recv_device, send_device, recv_splits, send_splits, group=ctx.group)
        clock.lap("all_to_all")
        recv_buffer.copy_(recv_device)
    # Received tensors are views of recv_buffer (no copy) unless ``copy``; the buffer lives as long as its samples.
    incoming = decode_samples(recv_buffer, sizes=plan.recv_sizes(sizes), copy=copy)
    kept = {index: by_flat[index] for index in plan.keep_indices}
    kept.update(zip(plan.recv_order(), incoming))
    return kept
