"""Every benchmark script run end to end on a small input, so none of them rots (real processes: launch tier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import data_wait  # noqa: E402 - benchmarks/ is put on the path just above
import split_search_gpu  # noqa: E402
import time_model_gpu  # noqa: E402


def test_analyze_benchmark_runs_small():
    result = subprocess.run([sys.executable, "benchmarks/analyze.py", "--samples", "200", "--base", "48"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| total, cold cache |" in result.stdout


@pytest.mark.parametrize("command", ["check", "analyze"])
def test_llava_paths_benchmark_runs_small(command):
    # 64 rows: one batch of check's (BATCH_ROWS), checked in its own process; its worker processes (two more fresh
    # interpreters, two thirds of this run's CPU at 100 rows) are test_check.py's launch test's.
    result = subprocess.run([sys.executable, "benchmarks/llava_paths.py", command, "--rows", "64"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| 64 | " in result.stdout
    assert ("`bad: none of 64 rows`" if command == "check" else "`costs: all 64 rows counted from their text and image headers") in result.stdout


def test_encoder_step_benchmark_smoke(tmp_path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "benchmarks/encoder_step_gpu.py", "--device", "cpu", "--smoke", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "encoder_step.json").read_text())
    results = {r["mode"]: r for r in report["results"]}
    assert set(results) == {"off", "on, window 1", "on, window 4", "on, window 4, across"}
    for result in results.values():
        assert result["dp"] == 2 and result["steps_timed"] == 2
        for step in result["steps"]:
            assert len(step["rank_ms"]) == 2 and all(ms > 0 for ms in step["rank_ms"])
            assert sum(len(ids) for ids in step["sample_ids"]) == 2
        assert result["slowest_sum_ms"] >= result["mean_sum_ms"] > 0
    off, on = results["off"]["steps"], results["on, window 1"]["steps"]
    for before, after in zip(off, on, strict=True):
        # The same global micro-batch, balanced: the heaviest rank never carries more image tokens (exact search).
        assert sorted(sum(before["sample_ids"], [])) == sorted(sum(after["sample_ids"], []))
        assert max(after["image_tokens"]) <= max(before["image_tokens"])
    assert "| dp | micro-batch | mode |" in (tmp_path / "encoder_step.md").read_text()


def test_dp1_permutation_benchmark_runs_small():
    result = subprocess.run([sys.executable, "benchmarks/dp1_permutation.py", "--samples", "4", "--iterations", "20", "--warmup", "2",
                             "--distinct-windows", "2", "--no-docs"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split("|") for line in result.stdout.splitlines() if line.startswith("| 4 | ")]
    assert len(rows) == 1 and all(float(cell) > 0 for cell in rows[0][3:9]), result.stdout  # on and off both timed
    assert "4 samples against the 200 us target: metrics on (the default)" in result.stdout


def test_energon_source_benchmark_runs_small(tmp_path):
    import subprocess

    result = subprocess.run([sys.executable, "benchmarks/energon_source.py", "--samples", "300", "--cache", str(tmp_path / "data")],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split("|") for line in result.stdout.splitlines() if line.startswith("| energon |") or line.startswith("| mimo |")]
    assert [row[1].strip() for row in rows] == ["energon", "mimo"] and all(row[2].strip() == "300" for row in rows)


def test_split_search_smoke_measures_every_split_and_validates_the_chosen_ones(tmp_path):
    measured, validated = tmp_path / "measured", tmp_path / "validated"
    assert split_search_gpu.main(["--device", "cpu", "--smoke", "--layouts", "4x8", "--steps", "1", "--out", str(measured)]) == 0
    body = json.loads((measured / "results.json").read_text())
    assert body["steps_timed"] == {"4x8": 1} and all(t >= 0 for t in body["tables"]["4x8"].values())
    result = json.loads((measured / "evaluation.json").read_text())[0]
    best = result["methods"]["best"]["slowest_ms"]
    # The best split is the minimum over every split of the same table, so no planner beats it there.
    assert all(best <= m["slowest_ms"] + 1e-9 for m in result["methods"].values())
    assert split_search_gpu.main(["--device", "cpu", "--smoke", "--layouts", "4x8", "--from-results", str(measured / "results.json"),
                                  "--validate", "--repeats", "1", "--out", str(validated)]) == 0
    fresh = json.loads((validated / "validation.json").read_text())["timings"]["4x8"]
    config = split_search_gpu.PipelineConfig
    samples = split_search_gpu.processed_samples(16, config.seq_length, lambda line: None)
    model = split_search_gpu.TimeModel(**{k: v for k, v in body["model"].items() if k not in ("format", "version")})
    chosen = split_search_gpu.chosen_splits(samples, body["tables"]["4x8"], model, 4, 8, 1, config.seed)
    assert set(fresh) == {k for per_step in chosen.values() for ks in per_step for k in ks}


def test_time_model_gpu_smoke_run(tmp_path):
    assert time_model_gpu.main(["--device", "cpu", "--smoke", "--out", str(tmp_path)]) == 0
    body = json.loads((tmp_path / "results.json").read_text())
    modes = sorted((r["cost"], r["mode"]) for r in body["results"])
    assert modes == [("calibrated", "across"), ("calibrated", "micro-batch"), ("calibrated, no floor", "across"),
                     ("linear", "across"), ("linear", "micro-batch"), ("linear", "off")]
    for result in body["results"]:
        assert len(result["steps"]) == 2 and all(len(step["measured_s"]) == 2 for step in result["steps"])
    assert "| vision dp 2, micro-batch 8 |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "time_model.json").is_file()


def test_exchange_bandwidth_benchmark_runs_small(tmp_path):
    """Two spawned ranks, one window: the exchange and the raw all_to_all of the same splits are both timed."""
    result = subprocess.run([sys.executable, "benchmarks/exchange_bandwidth.py", "--no-docs", "--windows", "1", "--bandwidth-windows", "2",
                             "--bandwidth-reps", "1", "--dataset-size", "32", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])["bandwidth"][0]
    assert figures["window"] == 1 and figures["exchange_ms"] > 0 and figures["raw_ms"] > 0, figures


def test_window_few_costs_benchmark_runs_small():
    result = subprocess.run([sys.executable, "benchmarks/window_few_costs.py", "--windows", "2"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| 4 x 16 / 8, 60%, 256/576/1024 (the reported kind) | 2 (2) | " in result.stdout


def test_data_wait_benchmark_runs_small(tmp_path, capsys):
    # The script's main in this process (as the split-search and time-model smokes above): a fresh interpreter
    # would import torch and the processor's stack again, most of this test's CPU.
    out = tmp_path / "data_wait.json"
    assert data_wait.main(["--iterations", "2", "--warmup", "1", "--workers", "1", "--iteration-ms", "20", "--micro-batch-size", "2",
                           "--json", str(out)]) == 0
    assert "| read-ahead | 1 workers: wait % (median ms / iteration) |" in capsys.readouterr().out
    figures = json.loads(out.read_text())["results"]
    assert [(r["mode"], r["read_ahead"] > 0) for r in figures] == [
        ("off", False), ("on, mimo_batch in get_batch", True), ("on + prepare_with(mimo_batch) (docs/megatron.md)", True)]
    assert all(0 <= r["wait_percent"] <= 100 and r["median_iteration_ms"] >= 20 for r in figures)
    for r in figures:  # every measured micro-batch is split by whether it was made; the loader's share is within the wait
        assert r["ready"][0] + r["not_ready"][0] == 2 * 2, r
        assert 0 <= r["inside_next_ms"] <= sum(r["waits_ms"]) + 0.01, r


def test_data_wait_benchmark_measures_the_serial_cpu_with_default_workers(capsys):
    from mimo_pipes.config.workers import processing_workers

    assert data_wait.main(["--serial-cpu", "--workers", "default", "--warmup", "1", "--iterations", "4", "--micro-batch-size", "2"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["workers"] == processing_workers(None)  # num_workers left unset: the rank's cores
    assert figures["next"] > 0 and figures["mimo_batch"] > 0 and figures["state_dict"] > 0 and figures["drop"] >= 0


def test_data_wait_benchmark_measures_each_threads_cpu():
    result = subprocess.run([sys.executable, "benchmarks/data_wait.py", "--thread-cpu", "--workers", "1", "--warmup", "1",
                             "--iterations", "4", "--micro-batch-size", "2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["workers"] == 1 and figures["samples"] == 8 and figures["samples_per_s"] > 0
    threads = figures["threads"]
    assert threads["mimo-pipes-process_N"]["threads"] == 1  # the one worker, its number folded into the group
    assert threads["mimo-pipes-process_N"]["ms_per_sample"] > 0  # the worker did the processing
    assert "mimo-pipes-read-ahead" in threads and "MainThread" in threads


def test_s3_rows_benchmark_runs_small(tmp_path):
    pytest.importorskip("moto.server")
    result = subprocess.run([sys.executable, "benchmarks/s3_rows.py", "--rows", "24", "--threads", "2", "--grid", "2:8", "--repeats", "1",
                             "--servers", "2", "--client-cpus", "1", "--json", str(tmp_path / "s3.json")],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in result.stdout.splitlines() if line.startswith(("| bytes |", "| paths |"))]
    assert [(row[0], row[1], row[2], row[3]) for row in rows] == [("bytes", "2", "16", "64"), ("paths", "2", "2", "8")]
    assert all(float(row[4]) > 0 and float(row[5]) > 0 for row in rows)  # disk and S3 rows per second measured
    assert int(rows[1][7]) >= 24  # images by path: a request per row at least
    figures = json.loads((tmp_path / "s3.json").read_text())
    assert figures["machine"]["servers"] == 2 and len(figures["machine"]["front_end_cpu_s"]) == 2
    if len(os.sched_getaffinity(0)) > 1:
        assert len(figures["machine"]["client_cpus"]) == 1  # --client-cpus 1: the benchmark's process on one CPU
    assert [cell["layout"] for cell in figures["cells"]] == ["bytes", "paths"]
    assert all(abs(cell["s3_rows_s"] - float(row[5])) <= 1 for cell, row in zip(figures["cells"], rows))  # the table's figures
    assert figures["cells"][1]["client_cpu_ms_per_row_s3"] > 0  # the client's CPU per row read from /proc


def test_s3_server_cost_benchmark_runs_small():
    pytest.importorskip("moto.server")
    result = subprocess.run([sys.executable, "benchmarks/s3_server_cost.py", "--gets", "40", "--objects", "8", "--delay-ms", "1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in result.stdout.splitlines() if line.startswith(("| s3 |", "| dispatcher |"))]
    assert [(row[0], row[1].split(",")[0]) for row in rows] == [("s3", "direct"), ("s3", "proxy"), ("dispatcher", "direct"), ("dispatcher", "proxy")]
    assert all(int(row[2]) > 0 and float(row[3]) >= 0 and float(row[5]) > 0 for row in rows)  # GETs/s and CPU per GET measured


def test_rank_throughput_benchmark_smoke_measures_the_code_before_beside_the_code(tmp_path):
    # One run (one data generation, one start-up) for every kind of cell: the anchor, both processing kinds, and the
    # code before (one window ahead, pixels copied, text tokenized holding the GIL) beside the code.
    out = tmp_path / "rank.json"
    variants = ["anchor", "rows/thread", "rows/process", "rows/thread/ahead1/copied/held"]
    done = subprocess.run([sys.executable, "benchmarks/rank_throughput.py", "--smoke", "--no-docs", "--data", str(tmp_path / "data"),
                           "--variants", ",".join(variants), "--min-microbatches", "3", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert [(r["variant"], r["workers"]) for r in results] == [(variant, 1) for variant in variants]
    assert all(r["samples_per_s"] > 0 and r["microbatches"] >= 3 for r in results)  # --min-microbatches holds
    assert "| rows/process | " in done.stdout
