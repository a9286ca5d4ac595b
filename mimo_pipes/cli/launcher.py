"""Starting a job's ranks: spawned locally, or this process as one rank under torchrun.

``run`` and ``train`` hand the launcher a per-rank function (``rank_main(rank, world_size, config,
options)``, which joins the process group, runs the rank and leaves). The launcher reports its phases on
stderr, turns every rank's failure into one line, and waits for its ranks.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from mimo_pipes.errors import ConfigError, PeerError, SampleError

EXIT_CONFIG = 2
EXIT_FAILED = 1

RankMain = Callable[[int, int, Any, Any], None]


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def say(message: str) -> None:
    """A phase of the launch, on stderr."""
    print(message, file=sys.stderr, flush=True)


def launch(rank_main: RankMain, config: Any, options: Any, world_size: int, command: str) -> int:
    """Run ``rank_main`` on every rank: as this process's rank under torchrun, else on ``world_size``
    spawned processes; the exit status of the job."""
    if under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != world_size:
            say(f"{command}: error: --component: modules cover {world_size} ranks but torchrun started {os.environ['WORLD_SIZE']}")
            return EXIT_CONFIG
        return rank_entry(rank_main, int(os.environ["RANK"]), world_size, None, config, options, command)
    return _spawn(rank_main, config, options, world_size, command)


def rank_entry(rank_main: RankMain, rank: int, world_size: int, port: int | None, config: Any, options: Any, command: str) -> int:
    """One rank from start to exit status: its failure is one line naming the rank (a traceback with
    ``MIMO_PIPES_TRACEBACK=1``)."""
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        rank_main(rank, world_size, config, options)
        return 0
    except (ConfigError, SampleError, PeerError) as error:
        print(f"{command}: rank {rank}: {error}", file=sys.stderr, flush=True)
    except Exception as error:  # noqa: BLE001 - one line per rank, then a non-zero exit
        print(f"{command}: rank {rank}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        if os.environ.get("MIMO_PIPES_TRACEBACK"):
            raise
    return EXIT_FAILED


def _spawned(rank_main: RankMain, rank: int, world_size: int, port: int, config: Any, options: Any, command: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(rank_entry(rank_main, rank, world_size, port, config, options, command))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawn(rank_main: RankMain, config: Any, options: Any, world_size: int, command: str) -> int:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    port = free_port()
    say(f"starting {world_size} ranks")
    processes = [
        context.Process(target=_spawned, args=(rank_main, rank, world_size, port, config, options, command), name=f"rank{rank}")
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    failed_at: float | None = None
    while any(process.is_alive() for process in processes):
        time.sleep(0.05)
        if failed_at is None and any(process.exitcode not in (None, 0) for process in processes):
            failed_at = time.monotonic()
        # A failed rank makes its peers fail within the exchange timeout; past that, stop them.
        if failed_at is not None and time.monotonic() - failed_at > config.exchange_timeout_s + 30:
            for process in processes:
                if process.is_alive():
                    process.kill()
    codes = [process.exitcode for process in processes]
    if any(codes):
        bad = [rank for rank, code in enumerate(codes) if code]
        say(f"{command}: failed on rank(s) {', '.join(map(str, bad))}")
        return EXIT_FAILED
    return 0
