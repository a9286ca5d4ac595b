"""benchmarks/sequence_packing.py on a small embedded dataset: the numbers it reports are consistent."""

from __future__ import annotations

import runpy
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "sequence_packing.py"


def test_benchmark_reports_less_padding_and_fewer_bytes_when_packed(tmp_path):
    main = runpy.run_path(str(BENCHMARK))["main"]
    report = main(["--samples", "48", "--seq-lengths", "2048", "--rows", "4", "--out", str(tmp_path / "out.json")])
    results = report["results"][2048]
    whole = results["embedded (all kinds)"]
    assert whole["microbatches"] == 12 and whole["samples"] == 48
    padded, longest = whole["padded to seq-length"], whole["padded to longest"]
    packed, multiple = whole["packed"], whole["packed, multiple K"]
    assert packed["padding_fraction"] == 0  # pad multiple 1: nothing but real tokens
    assert padded["padding_fraction"] > longest["padding_fraction"] > multiple["padding_fraction"] >= 0
    assert padded["tokens_per_microbatch"] == 4 * 2048
    assert packed["tokens_per_microbatch"] == whole["real_tokens"] / 12
    assert packed["token_mb_per_microbatch"] < longest["token_mb_per_microbatch"] < padded["token_mb_per_microbatch"]
    assert sum(r["samples"] for mix, r in results.items() if mix != "embedded (all kinds)") <= 48
    assert (tmp_path / "out.json").is_file()
