"""Runs the docs' runnable blocks in one interpreter, in order.

``python tests/doc_blocks.py JOBS RESULTS [GRACE_S]``: JOBS is a JSON list of ``{"name", "kind", "code"}``; kind
``python`` runs the code as ``python -c`` would (its own fresh ``__main__`` namespace, so a block that
leans on an earlier block's names fails as it would for a reader), kind ``command`` runs a
``mimo-pipes ...`` command line through the CLI's ``main`` in a scratch folder of its own. One JSON line
per job goes to RESULTS: ``{"name", "ok", "error", "folder", "seconds"}``. The exit status is 1 when any job failed.

One interpreter pays torch's and transformers' imports once instead of once per block. What a fresh
interpreter per block would have caught is still caught: a block that raises or exits non-zero fails, a
block that uses a name it does not define fails, and a block that leaves a non-daemon thread or child
process running (a fresh interpreter would hang at exit on it) fails too, naming what it left. Every
block runs even when one before it failed.
"""

from __future__ import annotations

import json
import linecache
import multiprocessing
import os
import shlex
import sys
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path

LEFTOVER_GRACE_S = 10.0  # threads and children a block stopped may take a moment to finish


def _running() -> tuple[list[threading.Thread], list[multiprocessing.process.BaseProcess]]:
    """Non-daemon threads (besides the main one) and non-daemon child processes alive now."""
    threads = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    return threads, [p for p in multiprocessing.active_children() if not p.daemon]


def _leftovers(before: tuple[list, list], grace_s: float) -> list[str]:
    """What a block started that is still running after it, past a grace period (not what earlier blocks left)."""
    deadline = time.monotonic() + grace_s
    while True:
        threads, children = (
            [item for item in now if item not in earlier] for now, earlier in zip(_running(), before)
        )
        if not threads and not children or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return [f"thread {t.name!r}" for t in threads] + [f"process {p.name!r} (pid {p.pid})" for p in children]


def _run_python(code: str, name: str) -> None:
    """As ``python -c``: the block is ``__main__`` (a fresh module, no file) while it runs."""
    module = types.ModuleType("__main__")
    runner = sys.modules["__main__"]
    sys.modules["__main__"] = module
    filename = f"<{name}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)  # tracebacks show the line
    try:
        exec(compile(code, filename, "exec"), module.__dict__)
    finally:
        sys.modules["__main__"] = runner


def _run_command(code: str, folder: Path) -> None:
    from mimo_pipes.cli.main import main

    args = shlex.split(code.replace("\\\n", " "))
    if args[0] != "mimo-pipes":
        raise ValueError(f"not a mimo-pipes command: {args[0]!r}")
    os.chdir(folder)  # relative --out lands in the scratch folder
    status = main([*args[1:], "--quiet"])
    if status != 0:
        raise SystemExit(status)


def run_job(job: dict, root: Path, scratch: Path, grace_s: float = LEFTOVER_GRACE_S) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="block-", dir=scratch))
    started, before = time.monotonic(), _running()
    error = None
    try:
        if job["kind"] == "python":
            _run_python(job["code"], job["name"])
        elif job["kind"] == "command":
            _run_command(job["code"], folder)
        else:
            raise ValueError(f"unknown kind {job['kind']!r}")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            error = f"exited with status {exit_.code!r}"
    except BaseException:  # noqa: BLE001 - every failure of a block is reported, the next block still runs
        error = traceback.format_exc()
    finally:
        os.chdir(root)
        sys.stdout.flush()
        sys.stderr.flush()
    left = _leftovers(before, grace_s)
    if left and error is None:
        error = "left running at its end (a fresh interpreter would not exit): " + ", ".join(left)
    return {"name": job["name"], "ok": error is None, "error": error, "folder": str(folder),
            "seconds": round(time.monotonic() - started, 2)}


def main(jobs_path: str, results_path: str, grace_s: str = str(LEFTOVER_GRACE_S)) -> int:
    root = Path.cwd()
    scratch = Path(os.environ.get("DOCS_TMP") or tempfile.mkdtemp())
    jobs = json.loads(Path(jobs_path).read_text())
    failed = stranded = False
    with open(results_path, "w") as results:
        for job in jobs:
            print(f"---- {job['name']}", flush=True)
            result = run_job(job, root, scratch, float(grace_s))
            failed = failed or not result["ok"]
            stranded = stranded or "left running at its end" in (result["error"] or "")
            results.write(json.dumps(result) + "\n")
            results.flush()
    if stranded:  # a normal exit would wait for the threads a block left behind: it is reported, leave now
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path[0] = ""  # as under ``python -c`` in the repository root: not this tests folder
    sys.exit(main(*sys.argv[1:]))
