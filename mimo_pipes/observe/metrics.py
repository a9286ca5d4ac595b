"""What the balance exchange did, per window and since the start: plain dicts a trainer can log.

Pure arithmetic on an :class:`~mimo_pipes.observe.observer.ExchangeRecord`. Every figure about the module (loads of
every DP rank, samples and bytes moved) comes from what the exchange's all-gather already gave every rank,
so all DP ranks of a module compute the same values without any further collective; ``rank/*`` and
``time/*`` are the rank's own. Keys (``q`` is ``image_tokens`` or ``cost``, ``when`` is ``before`` (as the
readers placed the samples, i.e. without reordering) or ``after`` (as the exchange delivered them)):

- ``{q}/{when}/per_rank``: each DP rank's load summed over the window's micro-batches (a list);
- ``{q}/{when}/max``, ``/min``, ``/mean``: the heaviest, lightest and mean rank's load per micro-batch,
  averaged over the window's micro-batches; ``/spread`` = max - min (the run summary's spread);
  ``/max_over_mean`` = max / mean (1.0 when nothing is loaded);
- ``{q}/{when}/critical_path``: sum over the window's micro-batches of the heaviest rank's load;
  ``{q}/critical_path_lower_bound``: no assignment of the window over the DP ranks can go below it;
- ``moved/samples``, ``moved/bytes``: samples that changed DP rank in the module and their packed bytes;
- ``rank/bytes_sent``, ``rank/bytes_received``, ``rank/samples_sent``, ``rank/samples_received``;
- ``time/exchange_s`` (the exchanging thread's whole exchange of the window), ``time/{phase}_s`` per phase of
  :data:`~mimo_pipes.observe.observer.EXCHANGE_PHASES` (collation is not the exchange's: its time is in the
  record's ``seconds["collate"]``), ``time/wait_s`` (the training thread's wait for the window in ``next()``);
- ``window``, ``first_step``, ``microbatches``, ``dp_rank``, ``dp_size``;
- ``cumulative/...``: the same sums, spreads and ratios over every window delivered since
  ``cumulative/since_step`` (``cumulative/windows``, ``cumulative/microbatches``): since the start of
  training (0), and a graph restored from a saved state continues its totals (they are part of the
  exchange node's state). Restored on another layout, they start again where it resumes: loads, critical
  paths and spreads over DP ranks of two layouts do not add up to a figure of either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mimo_pipes.balance import window_lower_bound
from mimo_pipes.observe.observer import EXCHANGE_PHASES, ExchangeRecord

QUANTITIES = ("image_tokens", "cost")
WHEN = ("before", "after")
# Sums kept over windows: critical paths, bounds, moves and times add up.
_SUMMED = ("moved/samples", "moved/bytes", "rank/bytes_sent", "rank/bytes_received", "rank/samples_sent",
           "rank/samples_received", "time/exchange_s", "time/wait_s", *(f"time/{phase}_s" for phase in EXCHANGE_PHASES))


def rank_loads(values: Sequence[Sequence[int]], assignment: Sequence[Sequence[Sequence[int]]] | None,
               dp_size: int, grid_size: int) -> list[list[int]]:
    """``loads[m][r]``: DP rank r's load in micro-batch m. ``assignment`` None: as the readers placed the
    samples (rank r holds positions r*B/d .. (r+1)*B/d - 1); else as it places them (slot g on rank g // (G/d))."""
    if not values:
        return []
    size = len(values[0])
    per_rank = size // dp_size
    if assignment is None:
        return [[sum(row[r * per_rank : (r + 1) * per_rank]) for r in range(dp_size)] for row in values]
    flat = [value for row in values for value in row]
    slots_per_rank = grid_size // dp_size
    loads = []
    for slots in assignment:
        per = [0] * dp_size
        for g, members in enumerate(slots):
            per[g // slots_per_rank] += sum(flat[i] for i in members)
        loads.append(per)
    return loads


def load_figures(loads: Sequence[Sequence[int]]) -> dict[str, Any]:
    """per_rank, max, min, mean, spread, max_over_mean and critical_path of ``loads[m][r]``."""
    count = len(loads)
    heaviest = [max(row) for row in loads]
    lightest = [min(row) for row in loads]
    total = sum(sum(row) for row in loads)
    dp_size = len(loads[0]) if loads else 1
    high = sum(heaviest) / count if count else 0.0
    mean = total / (count * dp_size) if count else 0.0
    return {
        "per_rank": [sum(row[r] for row in loads) for r in range(dp_size)],
        "max": high,
        "min": sum(lightest) / count if count else 0.0,
        "mean": mean,
        "spread": sum(h - lo for h, lo in zip(heaviest, lightest)) / count if count else 0.0,
        "max_over_mean": high / mean if mean else 1.0,
        "critical_path": sum(heaviest),
    }


def moves(record: ExchangeRecord) -> tuple[int, int]:
    """(samples that change DP rank, their packed bytes) in the whole module."""
    size = record.micro_batch_size
    if record.dp_size == 1 or not size:
        return 0, 0
    per_rank, slots_per_rank = size // record.dp_size, record.grid_size // record.dp_size
    samples = nbytes = 0
    for slots in record.assignment:
        for g, members in enumerate(slots):
            for i in members:
                if (i % size) // per_rank != g // slots_per_rank:
                    samples += 1
                    nbytes += record.encoded_bytes[i // size][i % size]
    return samples, nbytes


def window_metrics(record: ExchangeRecord) -> dict[str, Any]:
    """Everything about one window but the training thread's wait (known only on delivery)."""
    figures: dict[str, Any] = {
        "window": record.sequence,
        "first_step": record.first_step,
        "microbatches": len(record.costs),
        "dp_rank": record.dp_rank,
        "dp_size": record.dp_size,
    }
    for quantity, values in (("image_tokens", record.image_tokens), ("cost", record.costs)):
        for when, assignment in (("before", None), ("after", record.assignment)):
            loads = rank_loads(values, assignment, record.dp_size, record.grid_size)
            for name, value in load_figures(loads).items():
                figures[f"{quantity}/{when}/{name}"] = value
        bound = window_lower_bound(values, record.dp_size, record.across_microbatches) if values else 0
        figures[f"{quantity}/critical_path_lower_bound"] = bound
    figures["moved/samples"], figures["moved/bytes"] = moves(record)
    figures["rank/bytes_sent"], figures["rank/bytes_received"] = record.bytes_sent, record.bytes_received
    figures["rank/samples_sent"], figures["rank/samples_received"] = record.samples_sent, record.samples_received
    figures["time/exchange_s"] = record.exchange_seconds
    for phase in EXCHANGE_PHASES:
        figures[f"time/{phase}_s"] = record.seconds.get(phase, 0.0)
    return figures


class MetricsAccumulator:
    """Folds each window's figures into running totals; :meth:`add` returns the window's full dict.
    :meth:`state` / :meth:`load_state` carry the totals across a resume (JSON-plain: counts and sums)."""

    WINDOWS_KEY = "windows"
    MICROBATCHES_KEY = "microbatches"
    SUMS_KEY = "sums"
    PER_RANK_KEY = "per_rank"
    SINCE_KEY = "since_step"  # the first step the totals count (absent from older states: 0)

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._windows = 0
        self._microbatches = 0
        self._sums: dict[str, float] = {}
        self._per_rank: dict[str, list[int]] = {}
        self._since: int | None = None  # set by the first window counted

    def state(self) -> dict[str, Any]:
        """The running totals. Floats survive a JSON round trip exactly, so totals restored from a
        checkpoint continue bit for bit as if the run had not stopped."""
        return {
            self.WINDOWS_KEY: self._windows,
            self.MICROBATCHES_KEY: self._microbatches,
            self.SUMS_KEY: dict(self._sums),
            self.PER_RANK_KEY: {prefix: list(ranks) for prefix, ranks in self._per_rank.items()},
            self.SINCE_KEY: self._since,
        }

    def load_state(self, state: Mapping[str, Any] | None) -> None:
        """Continue from totals :meth:`state` returned; None starts from zero."""
        self.reset()
        if state is None:
            return
        self._windows = int(state[self.WINDOWS_KEY])
        self._microbatches = int(state[self.MICROBATCHES_KEY])
        self._sums = dict(state[self.SUMS_KEY])
        self._per_rank = {prefix: list(ranks) for prefix, ranks in state[self.PER_RANK_KEY].items()}
        since = state.get(self.SINCE_KEY, 0)
        self._since = None if since is None else int(since)

    def add(self, figures: dict[str, Any], wait_seconds: float) -> dict[str, Any]:
        figures = {**figures, "time/wait_s": wait_seconds}
        count = figures["microbatches"]
        if self._since is None:
            self._since = int(figures["first_step"])
        self._windows += 1
        self._microbatches += count
        sums = self._sums
        for name in _SUMMED:
            sums[name] = sums.get(name, 0) + figures[name]
        for quantity in QUANTITIES:
            name = f"{quantity}/critical_path_lower_bound"
            sums[name] = sums.get(name, 0) + figures[name]
            for when in WHEN:
                prefix = f"{quantity}/{when}"
                for name in ("max", "min", "mean", "spread"):  # per micro-batch averages: weight by count
                    key = f"{prefix}/{name}"
                    sums[key] = sums.get(key, 0) + figures[key] * count
                key = f"{prefix}/critical_path"
                sums[key] = sums.get(key, 0) + figures[key]
                ranks = self._per_rank.setdefault(prefix, [0] * len(figures[f"{prefix}/per_rank"]))
                for r, value in enumerate(figures[f"{prefix}/per_rank"]):
                    ranks[r] += value
        out = dict(figures)
        out["cumulative/windows"] = self._windows
        out["cumulative/microbatches"] = self._microbatches
        out["cumulative/since_step"] = self._since
        for name, value in sums.items():
            is_average = name.rsplit("/", 1)[-1] in ("max", "min", "mean", "spread")
            out[f"cumulative/{name}"] = value / self._microbatches if is_average and self._microbatches else value
        for quantity in QUANTITIES:
            for when in WHEN:
                prefix = f"{quantity}/{when}"
                high, mean = sums[f"{prefix}/max"], sums[f"{prefix}/mean"]
                out[f"cumulative/{prefix}/max_over_mean"] = high / mean if mean else 1.0
                out[f"cumulative/{prefix}/per_rank"] = list(self._per_rank[prefix])
        return out


class MovedPerWindow:
    """An exchange observer: what the exchange moved in each window it delivered, module-wide, as
    ``(first_step, microbatches, samples, bytes)`` (see :func:`moves`)."""

    def __init__(self) -> None:
        self.windows: list[tuple[int, int, int, int]] = []

    def __call__(self, record: ExchangeRecord) -> None:
        samples, nbytes = moves(record)
        self.windows.append((record.first_step, len(record.costs), samples, nbytes))

    def totals(self, end: int) -> tuple[int, int]:
        """(samples, bytes) moved in the windows that hold micro-batches before ``end`` (a window partly
        consumed counts whole; windows exchanged ahead of the consumer do not count)."""
        kept = [(samples, nbytes) for first_step, _, samples, nbytes in self.windows if first_step < end]
        return sum(samples for samples, _ in kept), sum(nbytes for _, nbytes in kept)


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The dict flattened for a scalar logger: lists become one entry per rank (``.../per_rank/3``)."""
    flat: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, list):
            for rank, item in enumerate(value):
                flat[f"{name}/{rank}"] = float(item)
        else:
            flat[name] = float(value)
    return flat


def summary_line(module: str, metrics: dict[str, Any]) -> str:
    """One line of the cumulative figures, for a log."""
    windows = metrics["cumulative/windows"]
    since = metrics.get("cumulative/since_step") or 0  # after a restart on another layout: where it resumed
    counted = f" since micro-batch {since}" if since else ""
    return (
        f"{module}: {windows} windows, {metrics['cumulative/microbatches']} micro-batches{counted}: image-token spread "
        f"{metrics['cumulative/image_tokens/before/spread']:.1f} -> {metrics['cumulative/image_tokens/after/spread']:.1f}, "
        f"critical path {metrics['cumulative/image_tokens/before/critical_path']} -> "
        f"{metrics['cumulative/image_tokens/after/critical_path']} (bound "
        f"{metrics['cumulative/image_tokens/critical_path_lower_bound']}), moved {metrics['cumulative/moved/samples']} "
        f"samples ({metrics['cumulative/moved/bytes'] / 1e6:.1f} MB), exchange "
        f"{1e3 * metrics['cumulative/time/exchange_s'] / windows:.1f} ms/window, training thread waited "
        f"{1e3 * metrics['cumulative/time/wait_s'] / windows:.2f} ms/window"
    )
