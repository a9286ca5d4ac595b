"""Pure arithmetic of one exchange: given a window's balanced assignment, who sends what to whom.

Layout (docs/design.md, canonical grid): a window has W micro-batches of B samples, G canonical slots of
B/G samples each. Samples are named by their flat window index ``m * B + j`` (micro-batch m, position
j in the global micro-batch). A module has d DP ranks, d | G, G | B:

* before the exchange, DP rank r holds positions ``r*B/d .. (r+1)*B/d - 1`` of every micro-batch
  (:func:`owner_of`);
* the assignment lists, per micro-batch and slot, the flat indices placed there; slot g belongs to
  DP rank ``g // (G/d)`` (:func:`slot_owner`), and a rank's output micro-batch is its slots
  concatenated in order.

Both sides of every transfer list the samples in ascending flat index, so the byte ranges of one ragged
``all_to_all_single`` line up without any further negotiation. Nothing here talks to other processes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ExchangePlan",
    "owner_of",
    "slot_owner",
    "local_flat_indices",
    "destinations",
    "validate_assignment",
    "plan_exchange",
    "permute_local",
]


def _check_layout(dp_size: int, num_slots: int, micro_batch_size: int) -> None:
    for name, value in (("dp_size", dp_size), ("num_slots", num_slots), ("microbatch_size", micro_batch_size)):
        if type(value) is not int or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if num_slots % dp_size:
        raise ValueError(f"num_slots {num_slots} is not a multiple of dp_size {dp_size}")
    if micro_batch_size % num_slots:
        raise ValueError(f"microbatch_size {micro_batch_size} is not a multiple of num_slots {num_slots}")


def owner_of(flat_index: int, micro_batch_size: int, dp_size: int) -> int:
    """DP rank that holds window sample ``flat_index`` before the exchange."""
    return (flat_index % micro_batch_size) // (micro_batch_size // dp_size)


def slot_owner(slot: int, num_slots: int, dp_size: int) -> int:
    """DP rank that owns canonical slot ``slot`` (and so receives the samples assigned to it)."""
    return slot // (num_slots // dp_size)


def local_flat_indices(dp_rank: int, dp_size: int, micro_batch_size: int, num_microbatches: int) -> list[int]:
    """Flat indices DP rank ``dp_rank`` holds before the exchange, ascending (its window, in order)."""
    per_rank = micro_batch_size // dp_size
    first = dp_rank * per_rank
    return [m * micro_batch_size + first + j for m in range(num_microbatches) for j in range(per_rank)]


def validate_assignment(assignment: Sequence[Sequence[Sequence[int]]], num_slots: int, micro_batch_size: int) -> int:
    """Check ``assignment`` is a permutation of the window laid out as W x G slots of B/G; return W.

    Raises ``ValueError`` naming the first micro-batch / slot / index at fault."""
    per_slot = micro_batch_size // num_slots
    num_microbatches = len(assignment)
    if num_microbatches < 1:
        raise ValueError("assignment is empty: expected at least one micro-batch")
    total = num_microbatches * micro_batch_size
    seen = [-1] * total  # slot (m * G + g) each index was seen in
    for m, slots in enumerate(assignment):
        if len(slots) != num_slots:
            raise ValueError(f"assignment micro-batch {m} has {len(slots)} slots, expected num_slots {num_slots}")
        for g, members in enumerate(slots):
            if len(members) != per_slot:
                raise ValueError(
                    f"assignment micro-batch {m} slot {g} has {len(members)} samples, expected {per_slot} "
                    f"(micro_batch_size {micro_batch_size} / num_slots {num_slots})"
                )
            for i in members:
                if type(i) is not int:
                    raise ValueError(f"assignment micro-batch {m} slot {g}: index {i!r} is not an int")
                if not 0 <= i < total:
                    raise ValueError(
                        f"assignment micro-batch {m} slot {g}: index {i} outside the window [0, {total}) "
                        f"({num_microbatches} micro-batches of {micro_batch_size})"
                    )
                if seen[i] >= 0:
                    pm, pg = divmod(seen[i], num_slots)
                    raise ValueError(
                        f"assignment places index {i} twice: micro-batch {pm} slot {pg} and micro-batch {m} slot {g}"
                    )
                seen[i] = m * num_slots + g
    # W*B distinct indices in [0, W*B): a permutation, nothing can be missing.
    return num_microbatches


def destinations(assignment: Sequence[Sequence[Sequence[int]]], num_slots: int, dp_size: int) -> list[int]:
    """``dest[flat_index]``: DP rank that holds each window sample after the exchange.

    Assumes a valid assignment (see :func:`validate_assignment`)."""
    per_rank_slots = num_slots // dp_size
    total = sum(len(members) for slots in assignment for members in slots)
    dest = [0] * total
    for slots in assignment:
        for g, members in enumerate(slots):
            owner = g // per_rank_slots
            for i in members:
                dest[i] = owner
    return dest


@dataclass(frozen=True)
class ExchangePlan:
    """What one DP rank does in the exchange of one window.

    ``send_indices[s]``: flat indices this rank sends to DP rank s, ascending (``[]`` for s == self).
    ``recv_indices[s]``: flat indices this rank receives from DP rank s, ascending (``[]`` for self).
    ``keep_indices``: flat indices this rank holds and keeps, ascending.
    ``output_order[m]``: flat indices of this rank's output micro-batch m, in canonical order (its slots
    concatenated, each slot as the assignment lists it).
    ``any_moves``: whether any sample of the window changes rank on any rank of the module; identical on
    every rank, so all of them can agree to skip the collective when it is False.

    The lists are owned by the plan: treat them as read-only."""

    dp_rank: int
    dp_size: int
    num_slots: int
    micro_batch_size: int
    num_microbatches: int
    send_indices: list[list[int]]
    recv_indices: list[list[int]]
    keep_indices: list[int]
    output_order: list[list[int]]
    any_moves: bool

    def send_order(self) -> list[int]:
        """Flat indices in send-buffer order: destination 0's samples, then 1's, ..."""
        return [i for chunk in self.send_indices for i in chunk]

    def recv_order(self) -> list[int]:
        """Flat indices in receive-buffer order: source 0's samples, then 1's, ..."""
        return [i for chunk in self.recv_indices for i in chunk]

    def send_split_bytes(self, packed_sizes: Sequence[int] | Mapping[int, int]) -> list[int]:
        """``input_split_sizes`` for ``all_to_all_single``: bytes sent to each rank.

        ``packed_sizes[i]`` is window sample i's packed size (every rank knows all of them)."""
        return [sum(packed_sizes[i] for i in chunk) for chunk in self.send_indices]

    def recv_split_bytes(self, packed_sizes: Sequence[int] | Mapping[int, int]) -> list[int]:
        """``output_split_sizes`` for ``all_to_all_single``: bytes received from each rank."""
        return [sum(packed_sizes[i] for i in chunk) for chunk in self.recv_indices]

    def recv_sizes(self, packed_sizes: Sequence[int] | Mapping[int, int]) -> list[int]:
        """Per-record sizes in receive-buffer order (for ``decode_samples(..., sizes=...)``)."""
        return [packed_sizes[i] for chunk in self.recv_indices for i in chunk]


def plan_exchange(
    assignment: Sequence[Sequence[Sequence[int]]],
    dp_rank: int,
    dp_size: int,
    num_slots: int,
    micro_batch_size: int,
    *,
    num_microbatches: int | None = None,
) -> ExchangePlan:
    """Build DP rank ``dp_rank``'s :class:`ExchangePlan` from a window's assignment.

    ``assignment[m][g]``: flat indices (``m' * B + j``) placed in slot g of output micro-batch m; with
    windows balanced across micro-batches a sample may land in another micro-batch. Raises
    ``ValueError`` on an inconsistent layout or an assignment that is not a permutation of the window
    (``num_microbatches``, if given, must equal ``len(assignment)``)."""
    _check_layout(dp_size, num_slots, micro_batch_size)
    if type(dp_rank) is not int or not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank must be in [0, {dp_size}), got {dp_rank!r}")
    w = validate_assignment(assignment, num_slots, micro_batch_size)
    if num_microbatches is not None and num_microbatches != w:
        raise ValueError(f"assignment has {w} micro-batches, expected num_microbatches {num_microbatches}")

    k = num_slots // dp_size
    output_order = [[i for g in range(dp_rank * k, (dp_rank + 1) * k) for i in slots[g]] for slots in assignment]
    if dp_size == 1:
        return ExchangePlan(
            dp_rank=0,
            dp_size=1,
            num_slots=num_slots,
            micro_batch_size=micro_batch_size,
            num_microbatches=w,
            send_indices=[[]],
            recv_indices=[[]],
            keep_indices=list(range(w * micro_batch_size)),
            output_order=output_order,
            any_moves=False,
        )

    per_rank = micro_batch_size // dp_size
    dest = destinations(assignment, num_slots, dp_size)
    send: list[list[int]] = [[] for _ in range(dp_size)]
    keep: list[int] = []
    # Samples this rank holds, ascending: fill send/keep in ascending order for free.
    for i in local_flat_indices(dp_rank, dp_size, micro_batch_size, w):
        s = dest[i]
        (keep if s == dp_rank else send[s]).append(i)
    # Samples coming here: the flattened output lists, minus the kept ones, grouped by source, sorted.
    recv: list[list[int]] = [[] for _ in range(dp_size)]
    for order in output_order:
        for i in order:
            src = (i % micro_batch_size) // per_rank
            if src != dp_rank:
                recv[src].append(i)
    for chunk in recv:
        chunk.sort()
    any_moves = any(dest[i] != (i % micro_batch_size) // per_rank for i in range(w * micro_batch_size))
    return ExchangePlan(
        dp_rank=dp_rank,
        dp_size=dp_size,
        num_slots=num_slots,
        micro_batch_size=micro_batch_size,
        num_microbatches=w,
        send_indices=send,
        recv_indices=recv,
        keep_indices=keep,
        output_order=output_order,
        any_moves=any_moves,
    )


def permute_local(samples_by_flat_index: Mapping[int, Any] | Sequence[Any], plan: ExchangePlan) -> list[list[Any]]:
    """This rank's output micro-batches: ``output_order`` looked up in ``samples_by_flat_index``.

    ``samples_by_flat_index`` maps flat index -> sample (a dict, or a list indexed by flat index); after
    an exchange it holds the kept and the received samples. With DP size 1 it is simply the local window
    (flat index == local position), and this is the whole exchange."""
    out: list[list[Any]] = []
    for m, order in enumerate(plan.output_order):
        try:
            out.append([samples_by_flat_index[i] for i in order])
        except (KeyError, IndexError):
            missing = [i for i in order if not _has(samples_by_flat_index, i)]
            raise KeyError(
                f"output micro-batch {m} of DP rank {plan.dp_rank} needs window samples {missing} that are not available"
            ) from None
    return out


def _has(container: Mapping[int, Any] | Sequence[Any], i: int) -> bool:
    if isinstance(container, Mapping):
        return i in container
    return 0 <= i < len(container)
