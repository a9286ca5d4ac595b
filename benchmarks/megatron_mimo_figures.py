"""Figures of ``recipes/megatron_mimo_train.py`` runs: a loss-curve PNG and the table docs/benchmarks.md shows.

Takes the JSON logs the recipe writes (one per ``--reorder`` mode); CPU only (matplotlib)::

    python benchmarks/megatron_mimo_figures.py DIR/megatron_mimo_off.json DIR/megatron_mimo_on.json \
        --png docs/megatron-mimo-loss.png

Prints one table row per log, then, for two logs, how far apart their losses are and whether every
iteration read the same samples (reordering only moves samples between an iteration's micro-batches).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def load(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def table(logs: list[dict[str, Any]]) -> str:
    header = ("| reorder | prefetch | iterations | loss first | loss last | median model ms | median wait ms "
              "| wait % | median mimo_batch ms | data on the training thread % | peak GiB |")
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for log in logs:
        s = log["summary"]
        lines.append(
            f"| {log['reorder']} | {log['settings']['prefetch']} | {s['iterations']} | {s['loss_first']:.4f} | {s['loss_last']:.4f} "
            f"| {s['median_model_ms']:.0f} | {s['median_wait_ms']:.2f} | {s['wait_percent']:.3f} | {s['median_batch_ms']:.1f} "
            f"| {s['data_percent']:.3f} | {s['peak_memory_gib']:.1f} |"
        )
    return "\n".join(lines)


def comparison(first: dict[str, Any], second: dict[str, Any]) -> str:
    pairs = list(zip(first["iterations"], second["iterations"]))
    largest = max(abs(a["loss"] - b["loss"]) for a, b in pairs)
    relative = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in pairs)
    same = all(sorted(sum(a["sample_ids"], [])) == sorted(sum(b["sample_ids"], [])) for a, b in pairs)
    moved = sum(a["sample_ids"] != b["sample_ids"] for a, b in pairs)
    return (f"reorder {first['reorder']} vs {second['reorder']}: largest loss difference {largest:.2e} ({relative:.1e} relative) over "
            f"{len(pairs)} iterations; same samples in every iteration: {same}; iterations whose micro-batches differ: {moved}")


def plot(logs: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, time_ax) = plt.subplots(1, 2, figsize=(11, 4))
    styles = ["-", "--", ":", "-."]
    for index, log in enumerate(logs):
        rows = log["iterations"]
        label = f"reorder {log['reorder']}, prefetch {log['settings']['prefetch']}"
        steps = [r["iteration"] for r in rows]
        loss_ax.plot(steps, [r["loss"] for r in rows], styles[index % len(styles)], label=label)
        time_ax.plot(steps, [r["model_ms"] for r in rows], styles[index % len(styles)], label=f"model, {label}")
        time_ax.plot(steps, [r["wait_ms"] for r in rows], styles[index % len(styles)], label=f"wait for data, {label}")
    environment = logs[0]["environment"]
    loss_ax.set(xlabel="iteration", ylabel="loss (per token, over the iteration)",
                title=f"MimoModel on the pipeline: {environment.get('gpu')}, megatron-core {environment.get('megatron-core')}")
    loss_ax.legend()
    time_ax.set(xlabel="iteration", ylabel="ms per iteration", yscale="log", title="model time and time waiting for data")
    time_ax.legend(fontsize="small")
    for ax in (loss_ax, time_ax):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", help="JSON logs of megatron_mimo_train")
    parser.add_argument("--png", help="write the loss curve here")
    args = parser.parse_args(argv)
    logs = [load(path) for path in args.logs]
    first = logs[0]
    environment = first["environment"]
    print(f"{first['date']}; {environment.get('gpu')}; torch {environment.get('torch')}, megatron-core {environment.get('megatron-core')}, "
          f"transformers {environment.get('transformers')}, python {environment.get('python')}")
    print(f"command: {first['command']}")
    print(table(logs))
    if len(logs) == 2:
        print(comparison(*logs))
    if args.png:
        plot(logs, args.png)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
