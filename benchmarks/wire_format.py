"""Sample packing throughput against plain tensor copies of the same bytes.

Realistic samples: input_ids (2048 int64) plus pixel_values of R rows x 1176 float32, R from 0 to 5000
(0 to ~23.5 MB), a grid tensor and a few metadata ints. For each size it times, median of several runs:

  clone        ``t.clone()`` of every tensor (fresh allocation each time)
  copy_        ``dst.copy_(t)`` into preallocated tensors (a pure memcpy, the floor for packing)
  encode_into    ``encode_into`` into a preallocated buffer (how the exchange fills its send buffer)
  encode_sample  ``encode_sample`` (allocates its output)
  unpack view  ``decode_sample`` zero-copy (tensors are views of the buffer)
  unpack copy  ``decode_sample(copy=True)``
  round trip   encode_into + unpack copy

Throughput is tensor payload bytes / time (GB/s, 1e9). Prints a Markdown table.

    python benchmarks/wire_format.py [--repeats N] [--threads T]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mimo_pipes.exchange.wire_format import decode_sample, encode_into, encode_sample, encoded_size, sample_encoding

ROWS = [0, 64, 256, 1024, 2500, 5000]


def make_sample(rows: int) -> dict:
    g = torch.Generator().manual_seed(rows)
    return {
        "sample_id": rows,
        "step": 7,
        "slot": 1,
        "image_tokens": rows // 4,
        "real_tokens": 2048,
        "cost": 123456789,
        "input_ids": torch.randint(0, 150000, (2048,), generator=g, dtype=torch.int64),
        "attention_mask": torch.ones(2048, dtype=torch.int64),
        "pixel_values": torch.randn(rows, 1176, generator=g, dtype=torch.float32),
        "image_grid_thw": torch.tensor([[1, 2, rows // 2]] if rows else [], dtype=torch.int64).reshape(-1, 3),
    }


def timed(fn, repeats: int) -> float:
    fn()  # warm up (page faults of first touch, allocator)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, median of {args.repeats}")
    print()
    cols = ["clone", "copy_", "pack_into", "pack_sample", "unpack view", "unpack copy", "round trip"]
    print("| pixel rows | payload MB | packed MB | " + " | ".join(f"{c} GB/s" for c in cols) + " | encode_into / copy_ |")
    print("|" + "---:|" * (len(cols) + 4))
    for rows in ROWS:
        s = make_sample(rows)
        tensors = [v for v in s.values() if isinstance(v, torch.Tensor)]
        payload = sum(t.numel() * t.element_size() for t in tensors)
        size = encoded_size(s)
        buf = torch.empty(size, dtype=torch.uint8)
        dsts = [torch.empty_like(t) for t in tensors]
        encode_into(s, buf)
        assert sample_encoding(s).size == size

        def copy_into():
            for d, t in zip(dsts, tensors):
                d.copy_(t)

        def round_trip():
            encode_into(s, buf)
            decode_sample(buf, copy=True)

        times = {
            "clone": timed(lambda: [t.clone() for t in tensors], args.repeats),
            "copy_": timed(copy_into, args.repeats),
            "pack_into": timed(lambda: encode_into(s, buf), args.repeats),
            "pack_sample": timed(lambda: encode_sample(s), args.repeats),
            "unpack view": timed(lambda: decode_sample(buf), args.repeats),
            "unpack copy": timed(lambda: decode_sample(buf, copy=True), args.repeats),
            "round trip": timed(round_trip, args.repeats),
        }
        gbps = {k: payload / v / 1e9 for k, v in times.items()}
        cells = []
        for c in cols:
            cells.append(f"{gbps[c]:.1f} ({times[c] * 1e6:.0f} us)")
        ratio = times["pack_into"] / times["copy_"]
        print(f"| {rows} | {payload / 1e6:.2f} | {size / 1e6:.2f} | " + " | ".join(cells) + f" | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
