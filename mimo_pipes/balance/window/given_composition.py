"""Balance a window whose micro-batches' samples are already chosen (a composition), over any grid.

A window balanced across micro-batches decides which samples form each micro-batch, then balances each
micro-batch over the G slots. A state saved inside such a window, restored on another layout (another G),
must keep the saved run's composition: the micro-batches already consumed took exactly their samples, so
the rest of the window must hold exactly the rest. These planners take the composition as given (flat
window indices ``m*B + j`` per output micro-batch, which do not depend on the grid) and only balance each
micro-batch over the new slots, as :func:`~mimo_pipes.balance.balance_microbatch` (one level) or as
:func:`~mimo_pipes.balance.balance_two_level` does inside a micro-batch (two levels). Pure functions of
the costs and the composition.
"""

from __future__ import annotations

from collections.abc import Sequence

from mimo_pipes.balance.microbatch import balance_microbatch
from mimo_pipes.balance.validate import check_floor, check_num_slots, check_window


def check_composition(composition: Sequence[Sequence[int]], count: int, size: int) -> list[list[int]]:
    """``composition`` is ``count`` micro-batches of ``size`` distinct flat indices of a ``count x size``
    window; returns it as lists of ints. Raises ValueError naming what is wrong."""
    if len(composition) != count:
        raise ValueError(f"composition has {len(composition)} micro-batches, the window {count}")
    seen: set[int] = set()
    out = []
    for m, members in enumerate(composition):
        members = [int(i) for i in members]
        if len(members) != size:
            raise ValueError(f"composition micro-batch {m} holds {len(members)} samples, expected {size}")
        for i in members:
            if not 0 <= i < count * size or i in seen:
                raise ValueError(f"composition micro-batch {m}: index {i} is outside the window or placed twice")
            seen.add(i)
        out.append(members)
    return out


def _canonical(slots: list[list[int]]) -> list[list[int]]:
    """Each slot ascending, slots ordered by their smallest index (as the window planner orders them)."""
    ordered = [sorted(slot) for slot in slots]
    return sorted(ordered, key=lambda slot: slot[0] if slot else -1)


def balance_composition(
    costs: Sequence[Sequence[int]], composition: Sequence[Sequence[int]], num_slots: int, floor: int = 0
) -> list[list[list[int]]]:
    """Per output micro-batch m (holding exactly ``composition[m]``), per slot, flat indices: each
    micro-batch balanced over ``num_slots`` slots on ``costs``."""
    window = check_window(costs, num_slots)
    floor = check_floor(floor)
    count, size = window.shape
    flat = window.reshape(-1).tolist()
    result = []
    for members in check_composition(composition, count, size):
        split = balance_microbatch([flat[i] for i in members], num_slots, floor)
        result.append(_canonical([[members[j] for j in slot] for slot in split]))
    return result


def balance_composition_two_level(
    encoder_costs: Sequence[Sequence[int]],
    language_costs: Sequence[Sequence[int]],
    composition: Sequence[Sequence[int]],
    num_groups: int,
    num_slots: int,
    floor: int = 0,
) -> list[list[list[int]]]:
    """As :func:`balance_composition` with two levels: each micro-batch over ``num_groups`` encoder replicas
    on the encoder cost (``floor`` per forward), then each group over its slots on the language cost. Slot
    ``g*k + j`` is the j-th slot of group g, so the fan-out pairing holds."""
    num_groups, num_slots = check_num_slots(num_groups), check_num_slots(num_slots)
    if num_slots % num_groups:
        raise ValueError(f"num_groups {num_groups} does not divide num_slots {num_slots}")
    encoder = check_window(encoder_costs, num_slots)
    language = check_window(language_costs, num_slots)
    count, size = encoder.shape
    flat_encoder, flat_language = encoder.reshape(-1).tolist(), language.reshape(-1).tolist()
    per_group = num_slots // num_groups
    result = []
    for members in check_composition(composition, count, size):
        groups = balance_microbatch([flat_encoder[i] for i in members], num_groups, check_floor(floor))
        groups = _canonical([[members[j] for j in group] for group in groups])
        slots: list[list[int]] = []
        for group in groups:
            split = balance_microbatch([flat_language[i] for i in group], per_group)
            slots.extend(sorted(group[j] for j in slot) for slot in split)
        result.append(slots)
    return result
