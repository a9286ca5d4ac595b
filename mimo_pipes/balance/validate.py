"""Input checks shared by every balancing entry point.

All balancing arithmetic is done on int64 arrays. The checks here make sure that is exact: costs are
plain non-negative integers (``bool`` is rejected even though it subclasses ``int``) and the total cost
of a window fits comfortably in 62 bits, so no sum or difference formed later can overflow.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

# Any sum of costs (and any difference of two such sums) stays far from the int64 limit.
MAX_TOTAL_COST = 2**62 - 1


def _is_int(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, np.integer)):
        return True
    return False


def check_num_slots(num_slots: object) -> int:
    """Return ``num_slots`` as an int, or raise ValueError if it is not an integer >= 1."""
    if not _is_int(num_slots):
        raise ValueError(f"num_slots must be an integer >= 1, got {num_slots!r}")
    value = operator.index(num_slots)  # type: ignore[arg-type]
    if value < 1:
        raise ValueError(f"num_slots must be an integer >= 1, got {value}")
    return value


def check_floor(floor: object, window: np.ndarray | None = None) -> int:
    """Return the per-forward ``floor`` as an int, or raise ValueError if it is not an integer >= 0, or if
    it is too large: alone, or with a validated (W, B) ``window`` (a critical path sums W loads of at least
    the floor, so W * floor plus the window's costs must stay within ``MAX_TOTAL_COST``)."""
    if not _is_int(floor) or operator.index(floor) < 0:  # type: ignore[arg-type]
        raise ValueError(f"floor must be an integer >= 0, got {floor!r}")
    value = operator.index(floor)  # type: ignore[arg-type]
    if value > MAX_TOTAL_COST:
        raise ValueError(f"floor {value} is too large (limit {MAX_TOTAL_COST})")
    if window is not None and window.shape[0] * value + int(window.sum(dtype=object)) > MAX_TOTAL_COST:
        raise ValueError(f"floor {value} over {window.shape[0]} micro-batches with their costs is too large (limit {MAX_TOTAL_COST})")
    return value


def check_costs(costs: Sequence[int], num_slots: int, what: str = "costs") -> np.ndarray:
    """Validate one micro-batch of costs against ``num_slots`` and return them as an int64 array.

    Raises ValueError naming the offending position or the size mismatch.
    """
    num_slots = check_num_slots(num_slots)
    if isinstance(costs, (str, bytes)) or not hasattr(costs, "__len__"):
        raise ValueError(f"{what} must be a sequence of integers, got {type(costs).__name__}")
    size = len(costs)
    # Fast paths: a list of plain ints (not bool, which is a subclass), or an integer numpy array.
    array = None
    if size and isinstance(costs, (list, tuple)) and set(map(type, costs)) == {int}:
        try:
            array = np.array(costs, dtype=np.int64)
        except OverflowError:
            array = None
    elif size and isinstance(costs, np.ndarray) and costs.ndim == 1 and costs.dtype.kind in "iu":
        if costs.dtype.kind == "i" or int(costs.max()) <= MAX_TOTAL_COST:
            array = costs.astype(np.int64)
    if array is not None:
        if int(array.min()) >= 0 and int(array.max()) <= MAX_TOTAL_COST // size:
            if size % num_slots:
                raise ValueError(
                    f"{what}: micro-batch size {size} is not divisible"
                    f" by the number of slots ({num_slots})"
                )
            return array
    values = []
    total = 0
    for position, cost in enumerate(costs):
        if not _is_int(cost):
            raise ValueError(f"{what}[{position}] must be an integer, got {cost!r}")
        cost = int(cost)
        if cost < 0:
            raise ValueError(f"{what}[{position}] must be >= 0, got {cost}")
        total += cost
        values.append(cost)
    if total > MAX_TOTAL_COST:
        raise ValueError(f"{what}: total cost {total} is too large (limit {MAX_TOTAL_COST})")
    if len(values) % num_slots:
        raise ValueError(
            f"{what}: micro-batch size {len(values)} is not divisible"
            f" by the number of slots ({num_slots})"
        )
    return np.asarray(values, dtype=np.int64).reshape(len(values))


def check_window(costs: Sequence[Sequence[int]], num_slots: int) -> np.ndarray:
    """Validate a window (W micro-batches of B costs each) and return an int64 array of shape (W, B)."""
    num_slots = check_num_slots(num_slots)
    if isinstance(costs, (str, bytes)) or not hasattr(costs, "__len__"):
        raise ValueError(f"costs must be a sequence of micro-batches, got {type(costs).__name__}")
    if len(costs) == 0:
        raise ValueError("costs: a window needs at least one micro-batch")
    rows = []
    size = None
    for m, row in enumerate(costs):
        if isinstance(row, (str, bytes)) or not hasattr(row, "__len__"):
            raise ValueError(f"costs[{m}] must be a sequence of integers, got {type(row).__name__}")
        if size is None:
            size = len(row)
        elif len(row) != size:
            raise ValueError(
                f"costs[{m}] has {len(row)} samples but costs[0] has {size}: "
                "every micro-batch of a window must have the same size"
            )
        rows.append(check_costs(row, num_slots, what=f"costs[{m}]"))
    array = np.stack(rows).astype(np.int64)
    if int(array.sum(dtype=object)) > MAX_TOTAL_COST:
        raise ValueError(f"costs: total cost of the window is too large (limit {MAX_TOTAL_COST})")
    return array
