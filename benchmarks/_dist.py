"""Plumbing shared by the exchange benchmarks: start ranks, describe the machine, write results into the docs.

Ranks are either spawned here (one process per rank, TCP rendezvous on localhost) or, when the script runs
under torchrun (RANK / WORLD_SIZE / MASTER_ADDR set), the current process is one of them.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import platform
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable
from typing import Any

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "benchmarks.md")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def under_torchrun() -> bool:
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _init(backend: str, rank: int, world_size: int, init_method: str, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    if "nccl" in backend:
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s)
    )


def _child(rank: int, world_size: int, port: int, backend: str, timeout_s: float, env: dict, fn: Callable, args: tuple, conn: Any) -> None:
    os.environ.update(env)
    try:
        _init(backend, rank, world_size, f"tcp://127.0.0.1:{port}", timeout_s)
        result = fn(rank, world_size, *args)
        conn.send(("ok", result))
    except BaseException as error:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"rank {rank}: {type(error).__name__}: {error}\n{traceback.format_exc()}"))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    *,
    backend: str = "gloo",
    timeout_s: float = 600.0,
    env: dict[str, str] | None = None,
) -> list[Any] | None:
    """Call ``fn(rank, world_size, *args)`` on every rank with a process group initialised.

    Returns the results by rank in the process that collects them (the parent when spawning, rank 0
    under torchrun) and None on the other torchrun ranks. Raises RuntimeError if any rank failed.
    """
    if under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        _init(backend, rank, world, "env://", timeout_s)
        import torch.distributed as dist

        try:
            result = fn(rank, world, *args)
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, result)
        finally:
            dist.destroy_process_group()
        return gathered if rank == 0 else None
    context = mp.get_context("spawn")
    port = _free_port()
    pipes, processes = [], []
    for rank in range(world_size):
        parent, child = context.Pipe(duplex=False)
        process = context.Process(
            target=_child, args=(rank, world_size, port, backend, timeout_s, dict(env or {}), fn, args, child), daemon=True
        )
        process.start()
        child.close()
        pipes.append(parent)
        processes.append(process)
    results, errors = [], []
    try:
        for rank, pipe in enumerate(pipes):
            if not pipe.poll(timeout_s):
                errors.append(f"rank {rank}: no result within {timeout_s:.0f}s")
                results.append(None)
                continue
            try:
                status, value = pipe.recv()
            except EOFError:
                status, value = "error", f"rank {rank}: exited without a result (exit code {processes[rank].exitcode})"
            results.append(value if status == "ok" else None)
            if status != "ok":
                errors.append(value)
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    if errors:
        raise RuntimeError("\n".join(errors))
    return results


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" where there is none)."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def cpu_count() -> str:
    """What `nproc` prints: the cores this process may use."""
    try:
        return subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return str(len(os.sched_getaffinity(0)))


def machine() -> dict[str, Any]:
    """What the docs record about where a benchmark ran."""
    import torch

    model, nproc = cpu_model(), cpu_count()
    try:
        date = subprocess.run(["date", "-u"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        date = datetime.datetime.now(datetime.UTC).strftime("%a %b %d %H:%M:%S UTC %Y")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    root = os.path.dirname(os.path.dirname(DOCS))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "mimo_pipes"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        commit += " with uncommitted changes in mimo_pipes" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "nproc": nproc,
        "cpu_model": model,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": date,
        "load_1min_at_start": round(load, 2),
        "commit": commit,
    }


def machine_line(info: dict[str, Any]) -> str:
    return (
        f"Machine: `nproc` {info['nproc']}, CPU \"{info['cpu_model']}\" (cores shared with other work; 1-minute "
        f"load average {info['load_1min_at_start']} at the start), Python {info['python']}, torch {info['torch']}, "
        f"library at commit {info['commit']}. Date: {info['date']}."
    )


def provenance_lines(command: str, info: dict[str, Any]) -> list[str]:
    """The lines under a results heading that say how to rerun it and where it ran."""
    return [
        "",
        "Command (from the repository root, in the project's virtual environment):",
        "",
        f"    {command}",
        "",
        machine_line(info),
        "",
    ]


def command_line() -> str:
    """The command as typed from the repository root, less ``--out DIR`` (where JSON copies went: a local
    path that changes nothing measured)."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), os.path.dirname(os.path.dirname(DOCS)))
    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        elif not arg.startswith("--out="):
            args.append(arg)
    return " ".join(["python", script, *args])


SECTION = "## Exchange"


def write_results(marker: str, body: str, path: str = DOCS, section: str = SECTION) -> None:
    """Replace the block between ``<!-- marker: begin -->`` and ``<!-- marker: end -->`` in ``section`` of
    the benchmarks page (the Exchange section by default; created at the end of the page if missing);
    other text is kept."""
    begin, end = f"<!-- {marker}: begin -->", f"<!-- {marker}: end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        lines = text.split("\n")
        if section not in lines:
            text = text.rstrip("\n") + f"\n\n{section}\n\n{block}\n"
        else:
            start = lines.index(section)
            stop = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
            while stop > start + 1 and not lines[stop - 1].strip():
                stop -= 1
            lines[stop:stop] = ["", block]
            text = "\n".join(lines)
    if not text.endswith("\n"):
        text += "\n"
    with open(path, "w") as handle:
        handle.write(text)


def time_calls(call: Callable[[], object], count: int) -> list[float]:
    """Seconds of each of ``count`` calls of ``call``, the garbage collector collected first and then off (a
    collection landing in one call would be the collector's time, not the call's)."""
    import gc
    import time

    times = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(count):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return times
