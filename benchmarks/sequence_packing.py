"""Sequence packing (THD) against padded micro-batches: padding fraction and bytes handed to the model.

The embedded synthetic dataset (``mimo_pipes.data``) is processed by the embedded processor at each
``--seq-length``; its rows, in dataset order, form micro-batches of ``--rows`` samples (one language rank's
micro-batch: B / dp). Each micro-batch is collated three ways and packed two ways:

  padded to seq-length   ``collate_microbatch(pad_length=seq_length)`` (``--pad-to-seq-length true``)
  padded to longest      padded to the micro-batch's longest sample (``--pad-to-seq-length false``)
  packed                 ``pack_microbatch``: one THD row of the real tokens
  packed, multiple K     every sequence padded to a multiple of K (``--pack-pad-multiple``; 2 x cp)

Padding fraction: token slots that hold no real token / all token slots, over all micro-batches.
Bytes: every tensor of the micro-batch (token fields, cu_seqlens, pixel_values, image_grid_thw), per
micro-batch on average; "token MB" counts the token fields (and cu_seqlens) only, which is what packing
changes. Mixes: the whole embedded mix and each of its kinds alone. Prints Markdown tables; ``--out``
also writes JSON. Arithmetic only: the numbers do not depend on the machine.

    python benchmarks/sequence_packing.py [--samples 512] [--seq-lengths 2048 4096] [--rows 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from mimo_pipes.data import KIND_MIX, default_dataset_path, default_processor_path, load_processor, open_dataset
from mimo_pipes.samples.collate import collate_microbatch
from mimo_pipes.samples.thd import CU_SEQLENS, CU_SEQLENS_UNPADDED, pack_microbatch

WHOLE_MIX = "embedded (all kinds)"
LAYOUTS = ("padded to seq-length", "padded to longest", "packed", "packed, multiple K")
TOKEN_FIELDS = ("input_ids", "attention_mask", "labels", "loss_mask", "position_ids", CU_SEQLENS, CU_SEQLENS_UNPADDED)


def tensor_bytes(batch: dict[str, Any], names: Sequence[str] | None = None) -> int:
    return sum(v.numel() * v.element_size() for k, v in batch.items() if isinstance(v, torch.Tensor) and (names is None or k in names))


def token_slots(batch: dict[str, Any]) -> int:
    return batch["input_ids"].numel()


class Totals:
    """Running totals of one mix: micro-batches are measured as they fill, so memory stays at one
    micro-batch per mix (processed samples hold megabytes of pixels). A short tail is dropped, as
    drop_last does."""

    def __init__(self, *, seq_length: int, rows: int, multiple: int, pad_values: dict) -> None:
        self.seq_length, self.rows, self.multiple, self.pad_values = seq_length, rows, multiple, pad_values
        self.pending: list[dict] = []
        self.count = self.real = 0
        self.totals = {layout: {"slots": 0, "bytes": 0, "token_bytes": 0} for layout in LAYOUTS}

    def add(self, sample: dict) -> None:
        self.pending.append(sample)
        if len(self.pending) == self.rows:
            self._measure(collate_microbatch(self.pending, step=self.count, pad_length=self.seq_length, pad_values=self.pad_values))
            self.pending = []

    def _measure(self, padded: dict[str, Any]) -> None:
        longest = int(padded["attention_mask"].sum(dim=1).max())
        shortened = {k: v[:, :longest] if k in TOKEN_FIELDS and isinstance(v, torch.Tensor) else v for k, v in padded.items()}
        layouts = {
            "padded to seq-length": padded,
            "padded to longest": shortened,
            "packed": pack_microbatch(padded, pad_values=self.pad_values),
            "packed, multiple K": pack_microbatch(padded, pad_multiple=self.multiple, pad_values=self.pad_values),
        }
        self.count += 1
        self.real += int(padded["attention_mask"].sum())
        for layout, batch in layouts.items():
            self.totals[layout]["slots"] += token_slots(batch)
            self.totals[layout]["bytes"] += tensor_bytes(batch)
            self.totals[layout]["token_bytes"] += tensor_bytes(batch, TOKEN_FIELDS)

    def result(self) -> dict[str, Any]:
        count = self.count
        result: dict[str, Any] = {"microbatches": count, "real_tokens": self.real, "samples": count * self.rows}
        for layout, total in self.totals.items():
            result[layout] = {
                "padding_fraction": 1 - self.real / total["slots"] if total["slots"] else 0.0,
                "tokens_per_microbatch": total["slots"] / count if count else 0.0,
                "mb_per_microbatch": total["bytes"] / count / 1e6 if count else 0.0,
                "token_mb_per_microbatch": total["token_bytes"] / count / 1e6 if count else 0.0,
            }
        return result


def measure(dataset, processor, *, seq_length: int, rows: int, multiple: int) -> dict[str, dict[str, Any]]:
    """Results per mix (the whole embedded mix, then each kind alone), rows in dataset order."""
    pad_values = {"input_ids": processor.pad_token_id, "labels": -100}
    mixes = {name: Totals(seq_length=seq_length, rows=rows, multiple=multiple, pad_values=pad_values)
             for name in (WHOLE_MIX, *KIND_MIX)}
    started = time.monotonic()
    for index in range(len(dataset)):
        row = dataset[index]
        sample = processor(row)
        sample["sample_id"] = index
        mixes[WHOLE_MIX].add(sample)
        mixes[row["kind"]].add(sample)
        if (index + 1) % 128 == 0:
            print(f"  processed {index + 1}/{len(dataset)} rows ({time.monotonic() - started:.0f}s)", file=sys.stderr, flush=True)
    return {name: totals.result() for name, totals in mixes.items()}


def table(results: dict[str, dict[str, Any]], seq_length: int, rows: int, multiple: int) -> str:
    head = (
        f"seq-length {seq_length}, {rows} samples per micro-batch, K = {multiple}\n\n"
        "| mix | micro-batches | real tok / sample | padding: to seq-length | to longest | packed | packed, K | "
        "tokens / packed row | token MB: to seq-length | to longest | packed | MB with pixels: to seq-length | packed |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for mix, r in results.items():
        if not r["microbatches"]:
            continue
        a, b, c, d = (r[layout] for layout in LAYOUTS)
        lines.append(
            f"| {mix} | {r['microbatches']} | {r['real_tokens'] / r['samples']:.0f} | {a['padding_fraction']:.1%} | "
            f"{b['padding_fraction']:.1%} | {c['padding_fraction']:.1%} | {d['padding_fraction']:.1%} | "
            f"{c['tokens_per_microbatch']:.0f} | {a['token_mb_per_microbatch']:.3f} | {b['token_mb_per_microbatch']:.3f} | "
            f"{c['token_mb_per_microbatch']:.3f} | {a['mb_per_microbatch']:.2f} | {c['mb_per_microbatch']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=512, help="size of the embedded dataset (default: 512)")
    parser.add_argument("--seq-lengths", type=int, nargs="+", default=[2048, 4096], help="default: 2048 4096")
    parser.add_argument("--rows", type=int, default=4, help="samples per micro-batch: B / language dp (default: 4)")
    parser.add_argument("--pad-multiple", type=int, default=8, help="K of the last packed layout (default: 8 = 2 x cp 4)")
    parser.add_argument("--out", default=None, help="also write the numbers as JSON here")
    args = parser.parse_args(argv)
    dataset = open_dataset(default_dataset_path(args.samples, seed=0))
    report: dict[str, Any] = {"samples": args.samples, "rows": args.rows, "pad_multiple": args.pad_multiple, "results": {}}
    for seq_length in args.seq_lengths:
        print(f"seq-length {seq_length}: processing {len(dataset)} rows", file=sys.stderr, flush=True)
        processor = load_processor(default_processor_path(), seq_length)
        results = measure(dataset, processor, seq_length=seq_length, rows=args.rows, multiple=args.pad_multiple)
        report["results"][seq_length] = results
        print(table(results, seq_length, args.rows, args.pad_multiple) + "\n", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
