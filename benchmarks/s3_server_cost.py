"""CPU per GET of the local S3 server, of the fault proxy and of the client, each in its own process.

Where the ceiling of ``benchmarks/s3_rows.py`` is: one Python process answers at most 1 / (its CPU per GET)
requests a second, whatever the client does. Starts moto's server (``--app s3``: its S3 service alone, as the
tests and the benchmark serve it; ``dispatcher``: its all-service dispatcher, as ``moto_server`` serves it) and
the tests' fault proxy in front of it, each in a process of its own, puts ``--objects`` objects of ``--size``
bytes, then reads them ``--gets`` times with obstore (``--concurrency`` threads), straight from the server and
through the proxy (``--delay-ms`` added). CPU seconds come from Linux ``/proc`` (all of a process's threads).

    python benchmarks/s3_server_cost.py --app s3 dispatcher
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "helpers"))  # the test suite's local S3 server and fault proxy
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from s3_rows import cpu_model, cpu_s, started  # noqa: E402


def serve(role: str, info: str, app: str, upstream: str, delay_ms: float) -> None:
    """``server``: moto on a free port; ``proxy``: the fault proxy before ``upstream``. Runs until killed."""
    if role == "server":
        if app == "s3":
            from s3_server import moto_s3_server

            _, url = moto_s3_server()
        else:
            from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
            from werkzeug.serving import make_server

            class Handler(MotoRequestHandler):
                disable_nagle_algorithm = True  # as the tests' server: no delayed-ACK stall between headers and body

            logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request, as the tests' server
            server = make_server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app), threaded=True, request_handler=Handler)
            url = f"http://127.0.0.1:{server.server_address[1]}"
            threading.Thread(target=server.serve_forever, daemon=True).start()
    else:
        from s3_faults import FaultProxy

        proxy = FaultProxy(upstream).__enter__()
        proxy.faults.delay_s = delay_ms / 1000
        url = proxy.url
    Path(info + ".part").write_text(json.dumps({"server": url, "pid": os.getpid()}))
    os.replace(info + ".part", info)
    time.sleep(3600)


def start(role: str, info: Path, app: str, upstream: str, delay_ms: float) -> tuple[subprocess.Popen, dict]:
    process = subprocess.Popen([sys.executable, __file__, "--serve", role, str(info), "--app", app, "--upstream", upstream,
                                "--delay-ms", str(delay_ms)])
    return process, started(info, process)


def cost(url: str, args: argparse.Namespace, pids: dict[str, int]) -> dict:
    """GETs/s and CPU milliseconds per GET of each process in ``pids`` and of this one (the client)."""
    import obstore
    from obstore.store import S3Store

    store = S3Store("bench", endpoint=url, access_key_id="testing", secret_access_key="testing", region="us-east-1",
                    client_options={"allow_http": "true", "pool_max_idle_per_host": str(args.concurrency)})

    def get(k: int) -> int:
        return len(bytes(obstore.get(store, f"k{k % args.objects}").bytes()))

    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(get, range(2 * args.concurrency)))  # connections opened before the clock
        before = {name: cpu_s(pid) for name, pid in pids.items()}
        client, start_s = time.process_time(), time.perf_counter()
        list(pool.map(get, range(args.gets)))
        elapsed = time.perf_counter() - start_s
    figures = {f"{name}_cpu_ms_per_get": round(1000 * (cpu_s(pid) - before[name]) / args.gets, 2) for name, pid in pids.items()}
    return {"gets_per_s": round(args.gets / elapsed), **figures, "client_cpu_ms_per_get": round(1000 * (time.process_time() - client) / args.gets, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--app", nargs="+", default=["s3", "dispatcher"], choices=["s3", "dispatcher"])
    parser.add_argument("--gets", type=int, default=1000)
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--size", type=int, default=12000, help="bytes an object (the benchmark's JPEGs are 3-20 kB)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve, app=args.app[0], upstream=args.upstream, delay_ms=args.delay_ms)
        return
    import tempfile

    import boto3

    print(f"{args.gets} GETs of {args.size} bytes, {args.concurrency} in flight; {os.cpu_count()} cores, {cpu_model()}, "
          f"1-minute load average {os.getloadavg()[0]:.2f}")
    print("| moto app | path | GETs/s | server CPU ms / GET | proxy CPU ms / GET | client CPU ms / GET |")
    print("|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="s3-cost-") as tmp:
        for app in args.app:
            server, found = start("server", Path(tmp) / f"{app}-server.json", app, "", 0)
            proxy, through = start("proxy", Path(tmp) / f"{app}-proxy.json", app, found["server"], args.delay_ms)
            try:
                client = boto3.client("s3", endpoint_url=found["server"], region_name="us-east-1",
                                      aws_access_key_id="testing", aws_secret_access_key="testing")
                client.create_bucket(Bucket="bench")
                body = os.urandom(args.size)
                for k in range(args.objects):
                    client.put_object(Bucket="bench", Key=f"k{k}", Body=body)
                pids = {"server": found["pid"], "proxy": through["pid"]}
                for path, url in (("direct", found["server"]), (f"proxy, {args.delay_ms:g} ms added", through["server"])):
                    got = cost(url, args, pids)
                    print(f"| {app} | {path} | {got['gets_per_s']} | {got['server_cpu_ms_per_get']:.2f} | "
                          f"{got['proxy_cpu_ms_per_get']:.2f} | {got['client_cpu_ms_per_get']:.2f} |", flush=True)
            finally:
                for process in (proxy, server):
                    process.kill()
                    process.wait()
    print(f"1-minute load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
