"""Per-module summary of a run from every rank's micro-batch records: pure arithmetic."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ModuleSummary:
    module: str
    dp_size: int
    steps: int
    samples: int
    image_tokens: int
    mean_spread_before: float  # mean over steps of (heaviest - lightest) per-rank image tokens, as the readers read them
    mean_spread_after: float  # the same for what the ranks actually consumed
    max_rank_tokens_before: int  # sum over steps of the heaviest rank (the vision critical path)
    max_rank_tokens_after: int


SUMMARY_ONLY_KEYS = ("slots", "read_steps", "tp_rank", "pp_rank")
"""Record keys the summary needs besides the ``--dump-assignments`` line (which does not carry them)."""


def summarize(records: Iterable[Mapping], grid_size: int) -> list[ModuleSummary]:
    """``records``: one per (rank, micro-batch) with module, dp_rank, dp_size, tp_rank, pp_rank, step,
    image_tokens, slots (the canonical slot each sample was read into) and read_steps (the step it was read
    at; the record's step when absent). Only TP/PP rank 0 lines count, since their peers hold the same samples.

    "Before" groups the consumed samples by (read step, read slot): each rank's load as the readers hold
    it, which is what the ranks consume with reordering off. With moves across micro-batches and a run that
    starts or stops inside a window, a read step at the cut counts only its consumed samples."""
    after: dict[str, dict[int, dict[int, int]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    before: dict[str, dict[int, dict[int, int]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    dp_sizes: dict[str, int] = {}
    samples: dict[str, int] = defaultdict(int)
    for record in records:
        if record.get("tp_rank", 0) or record.get("pp_rank", 0):
            continue
        module, dp_size, step = record["module"], record["dp_size"], record["step"]
        dp_sizes[module] = dp_size
        slots_per_rank = grid_size // dp_size
        tokens = record["image_tokens"]
        samples[module] += len(tokens)
        after[module][step][record["dp_rank"]] += sum(tokens)
        read_steps = record.get("read_steps") or [step] * len(tokens)
        for count, slot, read_step in zip(tokens, record["slots"], read_steps, strict=True):
            before[module][read_step][slot // slots_per_rank] += count
    summaries = []
    for module in sorted(after, key=lambda name: (name != "language", name)):
        dp_size = dp_sizes[module]
        spread_after = [_spread(after[module][step], dp_size) for step in after[module]]
        spread_before = [_spread(before[module][step], dp_size) for step in before[module]]
        summaries.append(
            ModuleSummary(
                module=module,
                dp_size=dp_size,
                steps=len(after[module]),
                samples=samples[module],
                image_tokens=sum(sum(loads.values()) for loads in after[module].values()),
                mean_spread_before=_mean(spread_before),
                mean_spread_after=_mean(spread_after),
                max_rank_tokens_before=sum(max(loads.values(), default=0) for loads in before[module].values()),
                max_rank_tokens_after=sum(max(loads.values(), default=0) for loads in after[module].values()),
            )
        )
    return summaries


def _spread(loads: Mapping[int, int], dp_size: int) -> int:
    values = [loads.get(rank, 0) for rank in range(dp_size)]
    return max(values) - min(values)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summary_document(summaries: Sequence[ModuleSummary], moved: Mapping[str, tuple[int, int]]) -> dict:
    """``run --summary-json``: ``{"modules": {name: figures}}``, the printed figures under the names of
    docs/design.md plus ``moved_samples`` and ``moved_bytes``, what the exchange moved (``moved``: per
    module; 0 and 0 for a module without an exchange)."""
    modules = {}
    for s in summaries:
        samples, nbytes = moved.get(s.module, (0, 0))
        modules[s.module] = {
            "dp_size": s.dp_size,
            "steps": s.steps,
            "samples": s.samples,
            "image_tokens": s.image_tokens,
            "spread_before": s.mean_spread_before,
            "spread_after": s.mean_spread_after,
            "critical_path_before": s.max_rank_tokens_before,
            "critical_path_after": s.max_rank_tokens_after,
            "moved_samples": samples,
            "moved_bytes": nbytes,
        }
    return {"modules": modules}


def format_summary(summaries: Sequence[ModuleSummary]) -> str:
    header = (
        f"{'module':<10} {'dp':>3} {'steps':>6} {'samples':>8} {'image tok':>10} "
        f"{'spread before':>14} {'spread after':>13} {'crit. path before':>18} {'after':>8}"
    )
    lines = [header, "-" * len(header)]
    for s in summaries:
        lines.append(
            f"{s.module:<10} {s.dp_size:>3} {s.steps:>6} {s.samples:>8} {s.image_tokens:>10} "
            f"{s.mean_spread_before:>14.1f} {s.mean_spread_after:>13.1f} {s.max_rank_tokens_before:>18} "
            f"{s.max_rank_tokens_after:>8}"
        )
    lines.append("spread: mean over micro-batches of (heaviest - lightest) per-rank image tokens; "
                 "crit. path: sum over micro-batches of the heaviest rank's image tokens; "
                 "before: as the readers read them (what reordering off consumes)")
    return "\n".join(lines)


# --- Sequence packing: padding before and after, per rank ---------------------------------------------


@dataclass(frozen=True)
class PackingSummary:
    module: str
    dp_rank: int
    microbatches: int
    real_tokens: int
    padded_tokens: int  # rows x padded length, summed over micro-batches: what the padded layout holds
    packed_tokens: int  # tokens of the packed rows, per-sequence padding included

    @property
    def padding_fraction_before(self) -> float:
        return 1 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0

    @property
    def padding_fraction_after(self) -> float:
        return 1 - self.real_tokens / self.packed_tokens if self.packed_tokens else 0.0

    @property
    def mean_tokens_per_packed_row(self) -> float:
        return self.packed_tokens / self.microbatches if self.microbatches else 0.0


def summarize_packing(records: Iterable[Mapping]) -> list[PackingSummary]:
    """Per (module, DP rank), from records carrying the packer's ``packing`` metrics (TP/PP rank 0 only)."""
    totals: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for record in records:
        metrics = record.get("packing")
        if metrics is None or record.get("tp_rank", 0) or record.get("pp_rank", 0):
            continue
        total = totals[(record["module"], record["dp_rank"])]
        total[0] += 1
        total[1] += metrics["real_tokens"]
        total[2] += metrics["rows"] * metrics["padded_length"]
        total[3] += metrics["tokens_per_packed_row"]
    return [
        PackingSummary(module, dp_rank, *totals[(module, dp_rank)])
        for module, dp_rank in sorted(totals, key=lambda key: (key[0] != "language", key))
    ]


def format_packing_summary(summaries: Sequence[PackingSummary]) -> str:
    header = f"{'module':<10} {'dp rank':>7} {'padding before':>15} {'padding after':>14} {'tokens/packed row':>18}"
    lines = ["sequence packing (THD)", header, "-" * len(header)]
    for s in summaries:
        lines.append(
            f"{s.module:<10} {s.dp_rank:>7} {s.padding_fraction_before:>15.1%} {s.padding_fraction_after:>14.1%} "
            f"{s.mean_tokens_per_packed_row:>18.1f}"
        )
    lines.append("padding: share of token slots that hold no real token, over the rank's micro-batches; "
                 "tokens/packed row: mean length of the packed row handed to the model")
    return "\n".join(lines)
