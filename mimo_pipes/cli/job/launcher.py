"""Starting a job's ranks: spawned locally, or this process as one rank under torchrun.

``run`` and ``train`` hand the launcher a per-rank function (``rank_main(rank, world_size, config,
options)``, which joins the process group, runs the rank and leaves). The launcher reports its phases on
stderr, turns every rank's failure into one line, and waits for its ranks. SIGTERM or SIGINT to the
launcher is passed to every rank once (they stop at their next micro-batch boundary, saving a complete
state first when the job saves one); ranks still alive a few seconds later are killed, so no process is
left behind. Spawned ranks are forked by the launch's rank server, which imported their heavy modules once
(``rank_server.py``); they also die with the launcher if it is killed outright. A rank killed outright
makes the launcher stop the others (SIGTERM, as torchrun's agent does); each says in its one line which
rank died, as the job's roll tells it (``exchange/roll_verdicts.py``: the launcher hosts the job's store, so that
the roll outlives every rank).
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from mimo_pipes.cli.job.peer_loss import lost_peer, lost_peer_line
from mimo_pipes.cli.job.rank_server import leave_rank_server, start_rank_server, stop_rank_server
from mimo_pipes.errors import ConfigError, PeerError, SampleError

EXIT_CONFIG = 2
EXIT_FAILED = 1
STOP_GRACE_S = 4.0  # after a stop signal, how long ranks get to reach a boundary (and save) before they are killed

RankMain = Callable[[int, int, Any, Any], None]

_reports: Any = None  # in a spawned rank: the pipe its phases go to


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def say(message: str, *, bar: bool = False) -> None:
    """A phase of the launch, on stderr. ``bar``: rank 0's progress bar (tqdm, in another process: its
    ``tqdm.write`` cannot be used) may stand unfinished on the current line; the message then starts a line
    of its own: on a terminal the bar's line is cleared first (the bar redraws below it), elsewhere (a log
    file, a pipe) the message starts on a new line."""
    start = ("\r\033[K" if sys.stderr.isatty() else "\n") if bar else ""
    # One write of the whole line: the ranks of a job share stderr, and print()'s separate write of the newline
    # let two ranks' lines run together ("...crashed)mimo-pipes run: rank 0: ...").
    sys.stderr.write(f"{start}{message}\n")
    sys.stderr.flush()


def _bar_shown(options: Any) -> bool:
    """Whether rank 0 shows a progress bar (``--quiet`` shows none)."""
    return bool(getattr(options, "progress", False))


def report_phase(phase: str, value: Any = None) -> None:
    """From a rank: tell the launcher a phase was reached (``joined``, ``saved``); nothing elsewhere."""
    if _reports is not None:
        _reports.send((phase, value))


def launch(rank_main: RankMain, config: Any, options: Any, world_size: int, command: str,
           before_exit: Callable[[], None] | None = None) -> int:
    """Run ``rank_main`` on every rank: as this process's rank under torchrun, else on ``world_size``
    spawned processes; the exit status of the job. Under torchrun the rank's process ends here, without the
    interpreter's teardown (``exit_now``): ``before_exit`` runs first (the save lock's release), as a
    caller's ``finally`` would not."""
    if under_torchrun():
        if int(os.environ["WORLD_SIZE"]) != world_size:
            say(f"{command}: error: --component: modules cover {world_size} ranks but torchrun started {os.environ['WORLD_SIZE']}")
            return EXIT_CONFIG
        pause_rank_start()  # this process is the rank's own: torchrun started it
        status = rank_entry(rank_main, int(os.environ["RANK"]), world_size, None, config, options, command)
        if before_exit is not None:
            before_exit()
        exit_now(status)
    return _spawn(rank_main, config, options, world_size, command)


_start_paused = False  # this process is a rank's own, its garbage collector paused since the rank started


def pause_rank_start() -> None:
    """A rank's own process starts: no cyclic garbage collection until :func:`rank_started`. Its start imports
    torch, transformers and datasets and builds the graph, some 400,000 long-lived objects that every pass of the
    collector would scan again (0.8 of a rank's 6 CPU-s for the README's job, measured on a 2-core machine; see
    :func:`~mimo_pipes.observe.third_party.paused_gc`)."""
    global _start_paused
    gc.disable()
    _start_paused = True


def rank_started() -> None:
    """The rank's graph is built (called by the rank's body): what the rank's start imported and built lives
    as long as its process, so it is frozen out of the collector's scans, and collection resumes. Nothing in a
    process whose start was not paused (a rank's body run in a caller's process keeps its collector as it is)."""
    global _start_paused
    if _start_paused:
        _start_paused = False
        gc.freeze()
        gc.enable()


def rank_entry(rank_main: RankMain, rank: int, world_size: int, port: int | None, config: Any, options: Any, command: str) -> int:
    """One rank from start to exit status: its failure is one line naming the rank (a traceback with
    ``MIMO_PIPES_TRACEBACK=1``); a stop by signal is 128 + the signal, said once by rank 0 under torchrun
    (the launcher says it for spawned ranks), or by every rank when a peer died (the stop may be for it).
    On its way out the rank says on the job's roll how it ended, so that its peers can tell it from a
    rank that died."""
    from mimo_pipes.cli.rank.stop_signal import StopRequested, exit_status
    from mimo_pipes.exchange.roll_store import call_roll

    if port is not None:
        # The launcher hosts the job's store, as torchrun's agent does: every rank joins it as a client.
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                          TORCHELASTIC_USE_AGENT_STORE="True")
    try:
        rank_main(rank, world_size, config, options)
        call_roll("done", read=False)
        return 0
    except StopRequested as stop:
        try:
            _hold_stop_signals()
        except StopRequested:  # a second stop, landing as the first is handled: this one is said
            _hold_stop_signals()
        verdict = call_roll("stopped", read=True)
        phrase = verdict.phrase(lost_peer=False) if verdict is not None else None
        if phrase:  # every rank: the one that says it alone may be the one that died
            say(f"{command}: rank {rank}: {stop}; {phrase}", bar=_bar_shown(options))
        elif port is None and rank == 0:
            say(f"{command}: {stop}")
        return exit_status(stop.signum)
    except Exception as error:  # noqa: BLE001 - one line per rank, then a non-zero exit
        # The launcher's SIGTERM (a peer died: every rank is stopped) may land as this rank begins to end; its
        # handler then raises on the hold's first line, inside this try (no signal's handler runs before it):
        # the failure said is still this one.
        try:
            _hold_stop_signals()
        except StopRequested:
            _hold_stop_signals()
        own = isinstance(error, (ConfigError, SampleError, PeerError))
        # A transport's text (Gloo's pair.cc ... Connection reset by peer) names a socket, not the rank that
        # ended: said in a few words here, with the rank the roll finds dead.
        lost = lost_peer(error) is not None
        verdict = call_roll("peer" if lost or isinstance(error, PeerError) else "error", read=lost)
        say(lost_peer_line(command, rank, error, verdict) or f"{command}: rank {rank}: {error if own else f'{type(error).__name__}: {error}'}",
            bar=_bar_shown(options))
        if os.environ.get("MIMO_PIPES_TRACEBACK") and not own:
            raise
    return EXIT_FAILED


def _hold_stop_signals() -> None:
    """A rank that is ending says its last words whatever comes: the stop handler of its loop is gone by now,
    and the SIGTERM a launcher sends every rank once one died (or once one failed) would otherwise end it by
    the default action before its line, its peers then taking it for dead too. It exits right after."""
    import threading

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies, however it dies: the rank server, which ends with
    the launcher (see ``rank_server.py``)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _spawned(arguments: bytes, reports: Any) -> None:
    """A spawned rank, forked by the launch's rank server (:mod:`~mimo_pipes.cli.job.rank_server`) with the
    rank's heavy modules already imported. Its arguments (``rank_main``, rank, world size, port, config, options,
    command) come pickled: unpickling them imports what the server did not, done once the rank's start has paused
    the garbage collector (:func:`pause_rank_start`)."""
    import pickle

    global _reports
    leave_rank_server()
    # Its own process group: a Ctrl-C at the terminal reaches the launcher alone, which passes it on once.
    os.setpgid(0, 0)
    _die_with_parent()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    pause_rank_start()
    rank_main, rank, world_size, port, config, options, command = pickle.loads(arguments)
    _reports = reports
    _stop_outside_the_loop()
    status = rank_entry(rank_main, rank, world_size, port, config, options, command)
    reports.close()
    exit_now(status)


def _stop_outside_the_loop() -> None:
    """A spawned rank's SIGTERM / SIGINT outside its loop (whose own handler stops at a boundary: while it starts,
    or leaves the process group after a failure) ends it at once through :func:`rank_entry`'s way out (its one
    line, 128 + the signal), never by the signal's default action: a rank ended so says nothing, and the launcher
    stops every rank with SIGTERM once one died, as its peers fail on the dead one."""
    from mimo_pipes.cli.rank.stop_signal import SIGNALS, StopRequested

    def stop(signum: int, frame: Any) -> None:
        raise StopRequested(signum)

    for signum in SIGNALS:
        signal.signal(signum, stop)


def exit_now(status: int) -> None:
    """End a rank's process without the interpreter's teardown: freeing torch, datasets and tokenizers
    object by object took seconds per rank, after the job was done. Everything the job writes is closed
    by then; multiprocessing's own exit work (its finalizers: semaphores of torchdata's mappers) still
    runs, and the standard streams are flushed."""
    import multiprocessing.util

    multiprocessing.util._exit_function()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class _Stop:
    """The launcher's own SIGTERM / SIGINT: remembered, and passed to every rank once."""

    def __init__(self, processes: list) -> None:
        self.processes = processes
        self.signum: int | None = None
        self.at: float | None = None
        self.previous = {signum: signal.signal(signum, self._handle) for signum in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            return
        self.signum, self.at = signum, time.monotonic()
        signal_ranks(self.processes, signum)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def signal_ranks(processes: list, signum: int) -> None:
    """``signum`` to every rank still running."""
    for process in processes:
        if process.is_alive() and process.pid is not None:
            try:
                os.kill(process.pid, signum)
            except ProcessLookupError:
                pass


def _ended_by_signal(processes: list, killed_here: set[int]) -> tuple[int, int] | None:
    """(rank, signal) of a rank that a signal ended which this launcher did not send (a kill -9, the OOM killer)."""
    for rank, process in enumerate(processes):
        code = process.exitcode
        if code is not None and code < 0 and rank not in killed_here:
            return rank, -code
    return None


def _start_quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (shared by the spawned ranks) without its leak warning: a
    rank killed outright leaves its semaphores to it, which it frees, and its warning ("There appear to be 6
    leaked semaphore objects") would be the job's last words instead of the line naming the dead rank."""
    from multiprocessing import resource_tracker

    previous = os.environ.get("PYTHONWARNINGS")
    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    os.environ["PYTHONWARNINGS"] = f"{previous},{quiet}" if previous else quiet
    try:
        resource_tracker.ensure_running()
    finally:
        if previous is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = previous


def _stop_resource_tracker(timeout_s: float = 5.0) -> None:
    """Close the resource tracker's pipe and wait for it to exit (it first frees what a killed rank left), so
    that no process of the job outlives the launcher: on its own the tracker exits only once it sees the
    launcher gone, a moment after."""
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    with tracker._lock:
        fd, pid = getattr(tracker, "_fd", None), getattr(tracker, "_pid", None)
        if fd is None or pid is None:
            return
        tracker._fd = tracker._pid = None  # a later use starts a new one
        os.close(fd)
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
                time.sleep(0.01)


def _spawn(rank_main: RankMain, config: Any, options: Any, world_size: int, command: str) -> int:
    import pickle

    from mimo_pipes.cli.rank.stop_signal import signal_name
    from mimo_pipes.exchange.roll_store import host_store

    _start_quiet_resource_tracker()
    context = start_rank_server([getattr(rank_main, "__module__", None), getattr(options, "recipe", None)])
    store, port = host_store()  # held until the ranks are gone
    started = time.monotonic()
    say(f"starting {world_size} ranks")
    pipes = [context.Pipe(duplex=False) for _ in range(world_size)]  # (the launcher's end, the rank's end)
    processes = [
        context.Process(target=_spawned, args=(pickle.dumps((rank_main, rank, world_size, port, config, options, command)), pipes[rank][1]),
                        name=f"rank{rank}")
        for rank in range(world_size)
    ]
    reports = {pipes[rank][0]: rank for rank in range(world_size)}
    stop = _Stop(processes)
    try:
        for process, (_, rank_end) in zip(processes, pipes):
            process.start()
            rank_end.close()  # the rank holds it now: a rank that ends closes the launcher's end too
        joined: set[int] = set()
        saved: int | None = None
        failed_at: float | None = None
        killed_here: set[int] = set()  # ranks this launcher killed (overdue, or past the stop grace)
        ended_by_signal: tuple[int, int] | None = None  # (rank, signal) of the first rank that a signal ended
        while any(process.is_alive() for process in processes):
            received = _receive(reports, joined, world_size, started)
            saved = received if received is not None else saved
            if failed_at is None and any(process.exitcode not in (None, 0) for process in processes):
                failed_at = time.monotonic()
            if ended_by_signal is None and stop.signum is None:
                ended_by_signal = _ended_by_signal(processes, killed_here)
                if ended_by_signal is not None:
                    say(f"{command}: rank {ended_by_signal[0]} was killed by {signal_name(ended_by_signal[1])}; "
                        "the other ranks cannot go on without it: stopping them", bar=_bar_shown(options))
                    # As torchrun's agent does: the others stop at their next boundary (or fail in their next
                    # collective with it), each naming it, instead of running on until a collective times out.
                    signal_ranks(processes, signal.SIGTERM)
            # A failed rank makes its peers fail within the exchange timeout; past that, or past the grace
            # after a stop signal, stop them.
            overdue = failed_at is not None and time.monotonic() - failed_at > config.exchange_timeout_s + 30
            if overdue or (stop.at is not None and time.monotonic() - stop.at > STOP_GRACE_S):
                for rank, process in enumerate(processes):
                    if process.is_alive():
                        killed_here.add(rank)
                        process.kill()
        for process in processes:
            process.join()
        saved = _drain(reports, saved)
    finally:
        stop.restore()
        for process in processes:
            if process.is_alive():
                process.kill()
        for process in processes:
            if process.pid is not None:  # started
                process.join()
        stop_rank_server()  # before the tracker: the server holds the tracker's pipe too
        _stop_resource_tracker()
        del store
    return _outcome(processes, stop.signum, getattr(options, "save_state", None), saved, ended_by_signal, command, bar=_bar_shown(options))


def _receive(reports: dict[Any, int], joined: set[int], world_size: int, started: float) -> int | None:
    """One look at the ranks' reports (rank -> launcher pipes): who joined the job, and the micro-batches of the
    last save a rank reported (None: no save reported). A pipe whose rank ended is dropped from ``reports``."""
    from multiprocessing.connection import wait

    saved = None
    for connection in wait(list(reports), timeout=0.05):
        try:
            phase, value = connection.recv()
        except EOFError:
            del reports[connection]
            continue
        if phase == "joined":
            joined.add(reports[connection])
            if len(joined) == world_size:
                say(f"all {world_size} ranks joined the job after {time.monotonic() - started:.1f}s; building their graphs")
        elif phase == "saved":
            saved = value
    return saved


def _drain(reports: dict[Any, int], saved: int | None) -> int | None:
    """What the ranks reported after the launcher's last look (every rank has ended): the last save, if any."""
    for connection in list(reports):
        while connection.poll():
            try:
                phase, value = connection.recv()
            except EOFError:
                break
            saved = value if phase == "saved" else saved
    return saved


def _outcome(processes: list[Any], signum: int | None, where: str | None, saved: int | None,
             ended_by_signal: tuple[int, int] | None, command: str, *, bar: bool) -> int:
    """The launcher's last words and exit status: stopped by a signal (and where the state went), failed on
    some ranks (and the rank a signal ended first), or 0. ``bar``: rank 0 shows a progress bar."""
    from mimo_pipes.cli.rank.stop_signal import exit_status, signal_name

    if signum is not None:
        state = f"; saved a complete state after {saved} micro-batches to {where}" if saved is not None else ""
        say(f"{command}: stopped by {signal_name(signum)}{state}")
        return exit_status(signum)
    codes = [process.exitcode for process in processes]
    if any(codes):
        bad = [rank for rank, code in enumerate(codes) if code]
        first = f" (rank {ended_by_signal[0]} was killed by {signal_name(ended_by_signal[1])} first)" if ended_by_signal else ""
        # A rank ended by a signal may be rank 0, its bar left unfinished on the line.
        say(f"{command}: failed on rank(s) {', '.join(map(str, bad))}{first}", bar=bar and ended_by_signal is not None)
        return EXIT_FAILED
    return 0
