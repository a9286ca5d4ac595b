"""Two-level balance: encoder replicas by encoder cost, then each replica's language replicas by language cost.

When the language module's DP is k > 1 times an encoder's DP (G = language dp, the encoder's d_enc = G/k),
encoder replica i feeds language replicas [i*k, (i+1)*k) (docs/design.md). A one-level plan balances the G
slots on one cost, so the encoder, which sees k slots as one forward, and the language model, which sees
one slot, are balanced on the same quantity. Here the window is first split into d_enc groups of k slots
on the encoder cost (each group is one encoder forward: the floor applies to it), then each group is split
into its k slots on the language cost. Slot g*k + j is the j-th slot of group g, so the fan-out pairing
holds by construction. Like every planner here it is a pure function of the costs.
"""

from __future__ import annotations

from collections.abc import Sequence

from mimo_pipes.balance.microbatch import balance_microbatch
from mimo_pipes.balance.validate import check_num_slots, check_window
from mimo_pipes.balance.window.planner import balance_window


def balance_two_level(
    encoder_costs: Sequence[Sequence[int]],
    language_costs: Sequence[Sequence[int]],
    num_groups: int,
    num_slots: int,
    across_microbatches: bool = False,
    floor: int = 0,
) -> list[list[list[int]]]:
    """Per micro-batch, per slot, indices into the flattened window (m*B + j), as :func:`balance_window`.

    ``num_groups`` encoder replicas (d_enc) each own ``num_slots // num_groups`` consecutive slots.
    ``floor`` is the encoder's per-forward floor, in encoder-cost units (one forward per group).
    Raises ValueError on invalid costs, windows of different shapes, or ``num_groups`` not dividing
    ``num_slots``."""
    num_groups = check_num_slots(num_groups)
    num_slots = check_num_slots(num_slots)
    if num_slots % num_groups:
        raise ValueError(f"num_groups {num_groups} does not divide num_slots {num_slots}")
    language = check_window(language_costs, num_slots)
    encoder = check_window(encoder_costs, num_slots)
    if encoder.shape != language.shape:
        raise ValueError(f"encoder costs {encoder.shape} and language costs {language.shape} differ in shape")
    per_group = num_slots // num_groups
    flat_language = language.reshape(-1).tolist()
    plan = balance_window(encoder.tolist(), num_groups, across_microbatches=across_microbatches, floor=floor)
    result = []
    for groups in plan:
        slots: list[list[int]] = []
        for group in groups:
            split = balance_microbatch([flat_language[i] for i in group], per_group)
            slots.extend([group[j] for j in slot] for slot in split)
        result.append(slots)
    return result
