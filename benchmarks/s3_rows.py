"""Rows per second a rank reads and processes from S3 against the same files on disk.

Writes ``--rows`` rows, one JPEG each (96 to 320 px a side), in two layouts: Parquet holding the image bytes
(``bytes``: a row group of 64 rows is one range request) and Parquet naming image files under ``images/``
(``paths``: one request per image). Serves them from ``--servers`` local S3 front ends, each its own process on
127.0.0.1: moto's S3 service holding the same bucket (uploaded to each) behind the tests' fault proxy adding
``--delay-ms`` to every request. The proxies listen on one shared port (``SO_REUSEPORT``), so the kernel spreads
the client's connections over them, as a load balancer spreads clients over S3's front ends: one Python process
answers at most a few hundred GETs a second, which is the server's ceiling, not the client's. A rank's graph
head is timed as a run builds it: the canonical reader (DP 1), for images in S3 the media prefetch (each row's
files fetched as it is read, ``--grid`` gives the requests in flight and the rows ahead), then N processing
threads (``--threads``, as ``--num-workers`` sets them) running the embedded processor. The disk rate is measured
at every N; the goal is S3 at >= 80% of it. Beside the rates: the servers' CPU per request and the client's CPU
per row (Linux ``/proc``). ``--client-cpus N`` keeps the benchmark's own process (disk and S3 alike) on N CPUs and
the front ends on the others, as if they were other machines, on a machine too small to hold both apart.

    python benchmarks/s3_rows.py --rows 384
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "helpers"))  # the test suite's local S3 server and latency proxy

WORDS = "the a picture shows small large red blue green card page chart line box text sign left right top bottom".split()


def generate(folder: Path, rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image, ImageDraw

    (folder / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    names, blobs, messages = [], [], []
    for k in range(rows):
        width, height = (int(side) for side in rng.integers(96, 321, 2))
        image = Image.new("RGB", (width, height), tuple(int(c) for c in rng.integers(0, 256, 3)))
        ImageDraw.Draw(image).ellipse([width // 5, height // 5, width // 2, height // 2], fill=(30, 30, 30))
        image.save(folder / "images" / f"{k:06d}.jpg", quality=90)
        names.append([f"{k:06d}.jpg"])
        blobs.append([(folder / "images" / f"{k:06d}.jpg").read_bytes()])
        text = " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), 24))
        messages.append([{"role": "user", "content": f"<image>Describe {k}."}, {"role": "assistant", "content": text}])
    pq.write_table(pa.table({"images": names, "messages": messages}), folder / "paths.parquet", row_group_size=64)
    pq.write_table(pa.table({"images": blobs, "messages": messages}), folder / "bytes.parquet", row_group_size=64)


def serve(info_file: str, port: int, delay_ms: float, lifetime_s: float) -> None:
    """One front end: moto's S3 service and the latency proxy (on the shared ``port``), in this process, until
    killed or ``lifetime_s`` passes."""
    from s3_faults import FaultProxy
    from s3_server import moto_s3_server

    server, url = moto_s3_server()
    with FaultProxy(url, port=port, shared=True) as proxy:
        proxy.faults.delay_s = delay_ms / 1000
        Path(info_file + ".part").write_text(json.dumps({"server": url, "pid": os.getpid()}))
        os.replace(info_file + ".part", info_file)  # whole, once it exists
        time.sleep(lifetime_s)
    server.shutdown()


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, all its threads."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Pass:
    """One timed pass: rows/s, and over the same rows the client's CPU seconds and the servers' (all together)."""

    rate: float
    client_cpu_s: float
    server_cpu_s: float
    rows: int


def rate(dataset, processor, workers: int, rows: int, servers: list[int]) -> Pass:
    """Rows per second through a rank's head as the run builds it: the reader, then (images in S3) the media
    prefetch, then ``workers`` processing threads running the embedded processor."""
    import functools

    from torchdata.nodes import ParallelMapper

    from mimo_pipes.data.storage.s3_images import prefetch_media, prefetch_rows
    from mimo_pipes.data.storage.s3_url import is_s3
    from mimo_pipes.nodes import CanonicalShardReader, SnapshotGuard
    from mimo_pipes.nodes.media_prefetch import MediaPrefetch

    node = CanonicalShardReader(dataset, micro_batch_size=8, dp_rank=0, dp_size=1, grid_size=1, seed=3, dataloader_type="single")
    if is_s3(processor.image_folder):
        node = MediaPrefetch(node, start=functools.partial(prefetch_media, image_folder=processor.image_folder), ahead=prefetch_rows())
    node = ParallelMapper(SnapshotGuard(node), processor, num_workers=workers, in_order=True, method="thread")
    node.reset()
    node.next()  # the first row group and the threads started before the clock
    server_start, client_start = sum(cpu_s(pid) for pid in servers), time.process_time()
    start = time.perf_counter()
    for _ in range(rows - 8):
        node.next()
    elapsed = time.perf_counter() - start
    done = Pass((rows - 8) / elapsed, time.process_time() - client_start, sum(cpu_s(pid) for pid in servers) - server_start, rows - 8)
    node.shutdown() if hasattr(node, "shutdown") else None
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 16], help="processing threads (--num-workers)")
    parser.add_argument("--grid", nargs="+", default=["1:64", "4:64", "16:64", "64:64", "16:0"],
                        help="images by path: CONCURRENCY:PREFETCH_ROWS pairs (MIMO_PIPES_S3_CONCURRENCY, MIMO_PIPES_S3_PREFETCH_ROWS)")
    parser.add_argument("--layouts", nargs="+", default=["bytes", "paths"], choices=["bytes", "paths"])
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--servers", type=int, default=4, help="local S3 front ends (processes) behind one port")
    parser.add_argument("--repeats", type=int, default=2, help="measurements of each side at each thread count (the best is kept)")
    parser.add_argument("--client-cpus", type=int, default=0,
                        help="the benchmark's own process (both sides) on this many CPUs, the front ends on the others (0: all on all)")
    parser.add_argument("--json", help="also write every cell's figures to this file")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cpus", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        if args.cpus:
            os.sched_setaffinity(0, [int(cpu) for cpu in args.cpus.split(",")])
        serve(args.serve, args.port, args.delay_ms, lifetime_s=1800)
        return
    cpus = sorted(os.sched_getaffinity(0))
    if 0 < args.client_cpus < len(cpus):
        # As if the servers were other machines: they never take the client's cores, on disk or S3. Set before any
        # thread starts, so that every thread of this process inherits it.
        os.sched_setaffinity(0, cpus[: args.client_cpus])
        cpus = cpus[args.client_cpus:]
    from s3_server import free_port

    with tempfile.TemporaryDirectory(prefix="s3-rows-") as tmp:
        folder = Path(tmp)
        generate(folder / "data", args.rows)
        port = free_port()
        infos = [folder / f"front-end-{k}.json" for k in range(args.servers)]
        command = [sys.executable, __file__, "--port", str(port), "--delay-ms", str(args.delay_ms), "--cpus", ",".join(map(str, cpus)), "--serve"]
        servers = [subprocess.Popen([*command, str(info)]) for info in infos]
        try:
            fronts = [started(info, server) for info, server in zip(infos, servers)]
            measure(folder, fronts, f"http://127.0.0.1:{port}", args)
        finally:
            for server in servers:
                server.terminate()
            for server in servers:
                server.wait(timeout=30)


def started(info: Path, server: subprocess.Popen) -> dict:
    """What front end ``server`` wrote to ``info`` once it listens: its moto server's URL and its pid."""
    for _ in range(600):  # 60 s at most
        if info.exists():
            return json.loads(info.read_text())
        if server.poll() is not None:
            raise SystemExit(f"a local S3 front end exited ({server.returncode}) before it listened")
        time.sleep(0.1)
    raise SystemExit(f"a local S3 front end did not start within 60 s ({info})")


def upload(folder: Path, server: str) -> None:
    """Every file under ``folder`` into the bucket ``bench`` of the moto server at ``server``."""
    import boto3

    client = boto3.client("s3", endpoint_url=server, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket="bench")
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.put_object(Bucket="bench", Key=path.relative_to(folder).as_posix(), Body=path.read_bytes())


def measure(folder: Path, fronts: list[dict], endpoint: str, args: argparse.Namespace) -> None:
    from mimo_pipes.data.embedded.builtin_processor import default_processor_path
    from mimo_pipes.data.processing.processor import load_processor
    from mimo_pipes.data.sources.open_source import open_source
    from mimo_pipes.data.storage.s3_store import reset_store, store

    for front in fronts:  # each front end holds the whole bucket, as S3's front ends all reach the same data
        upload(folder / "data", front["server"])
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_ENDPOINT_URL": endpoint, "MIMO_PIPES_CACHE": str(folder / "cache")})
    processors = {side: load_processor(default_processor_path(), 1024, image_folder=where)
                  for side, where in (("disk", str(folder / "data" / "images")), ("s3", "s3://bench/images"))}
    pids = [front["pid"] for front in fronts]
    machine = {"cores": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(), "servers": len(fronts),
               "client_cpus": sorted(os.sched_getaffinity(0)),
               "load_start": os.getloadavg()[0], "rows": args.rows, "delay_ms": args.delay_ms, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    print(f"{args.rows} rows, {args.delay_ms:g} ms added to every request, {len(fronts)} S3 front ends; {os.cpu_count()} cores "
          f"(this process on {len(machine['client_cpus'])}), "
          f"{machine['cpu']}, 1-minute load average {machine['load_start']:.2f}")
    print("| layout | threads | S3 concurrency | prefetch rows | disk rows/s | S3 rows/s | S3 / disk | S3 requests | server CPU ms / request | client CPU ms / row, disk | S3 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    cells = []
    for layout in args.layouts:
        disk = open_source(str(folder / "data" / f"{layout}.parquet"))
        # Images in the Parquet file: one range request per row group, nothing for the concurrency to spread.
        grid = [tuple(int(v) for v in pair.split(":")) for pair in args.grid] if layout == "paths" else [(16, 64)]
        for workers in args.threads:
            on_disk = [rate(disk, processors["disk"], workers, args.rows, pids) for _ in range(args.repeats)]
            for concurrency, ahead in grid:
                os.environ.update({"MIMO_PIPES_S3_CONCURRENCY": str(concurrency), "MIMO_PIPES_S3_PREFETCH_ROWS": str(ahead)})
                on_s3, requests = [], []
                for _ in range(args.repeats):  # the best of each: the cores are shared, the best is the least disturbed
                    on_disk.append(rate(disk, processors["disk"], workers, args.rows, pids))
                    reset_store()  # a cold cache: every row group and image read from the server again
                    on_s3.append(rate(open_source(f"s3://bench/{layout}.parquet"), processors["s3"], workers, args.rows, pids))
                    requests.append(store().requests)
                cells.append(cell(layout, workers, concurrency, ahead, on_disk, on_s3, requests))
    machine.update(load_end=os.getloadavg()[0], front_end_cpu_s=[round(cpu_s(pid), 1) for pid in pids])
    print(f"1-minute load average {machine['load_end']:.2f} at the end; CPU seconds of each front end: {machine['front_end_cpu_s']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "cells": cells}, indent=1))


def cell(layout: str, workers: int, concurrency: int, ahead: int, on_disk: list[Pass], on_s3: list[Pass], requests: list[int]) -> dict:
    """One row of the table, printed: the best pass of each side; the CPU figures are over every S3 pass."""
    disk, s3 = max(p.rate for p in on_disk), max(p.rate for p in on_s3)
    figures = {"layout": layout, "threads": workers, "concurrency": concurrency, "prefetch_rows": ahead,
               "disk_rows_s": round(disk, 1), "s3_rows_s": round(s3, 1), "s3_over_disk": round(s3 / disk, 3), "s3_requests": requests[-1],
               "server_cpu_ms_per_request": round(1000 * sum(p.server_cpu_s for p in on_s3) / max(1, sum(requests)), 2),
               "client_cpu_ms_per_row_disk": round(1000 * sum(p.client_cpu_s for p in on_disk) / sum(p.rows for p in on_disk), 2),
               "client_cpu_ms_per_row_s3": round(1000 * sum(p.client_cpu_s for p in on_s3) / sum(p.rows for p in on_s3), 2)}
    print(f"| {layout} | {workers} | {concurrency} | {ahead} | {disk:.0f} | {s3:.0f} | {s3 / disk:.0%} | {requests[-1]} "
          f"| {figures['server_cpu_ms_per_request']:.2f} | {figures['client_cpu_ms_per_row_disk']:.1f} | {figures['client_cpu_ms_per_row_s3']:.1f} |", flush=True)
    return figures


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (the machine name elsewhere)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
