"""Where a rank's per-sample processing runs: the ``processing`` setting (``--processing``) resolved on the rank.

``thread``: on threads of the rank's own process. ``process``: on worker processes
(:mod:`mimo_pipes.samples.worker_start`), which decode, resize and cut patches in parallel without sharing one
interpreter lock, and lay pixels out in shared memory (:mod:`mimo_pipes.samples.handover`). ``auto`` (the default)
takes worker processes where they pay: the rank has two workers or more (one worker process makes what one thread
makes, and costs a start and a hand-over), they start from the library's own server (POSIX systems on the Pythons
tested), this process may start processes (a daemonic one may not), and what they run pickles (a function of the
user's own, a lambda say, may not) without naming an unguarded main module; else threads, with the reason logged
once. The stream is the same either way (the order is kept, and the pixels are bit for bit the processor's)."""

from __future__ import annotations

import logging
import multiprocessing
import pickle
from collections.abc import Iterable

from mimo_pipes.config.flags import flag
from mimo_pipes.errors import ConfigError
from mimo_pipes.samples import worker_start

logger = logging.getLogger(__name__)

AUTO, THREAD, PROCESS = "auto", "thread", "process"
PROCESSING_SETTINGS = (AUTO, THREAD, PROCESS)
_said: set[str] = set()  # the reasons auto chose threads, each logged once a process


def check_processing(setting: object) -> None:
    """``setting`` is one of :data:`PROCESSING_SETTINGS`; else ConfigError naming ``processing`` (its flag in a
    command): the config's field and a recipe's keyword are checked alike."""
    if setting not in PROCESSING_SETTINGS:
        raise ConfigError(flag("processing"), f"must be one of {', '.join(PROCESSING_SETTINGS)}, got {setting!r}")


def processing_method(setting: str, workers: int, work: Iterable[object] = ()) -> str:
    """``thread`` or ``process`` for ``setting`` (see the module doc), given the rank's ``workers`` and the
    callables the workers would run (``work``; pickled here once to tell)."""
    check_processing(setting)
    if setting == THREAD:
        return THREAD
    pickles = _pickled(work)
    if setting == PROCESS:
        problem = _daemonic() or _main_rerun(pickles)
        if problem is not None:  # said here, before any worker starts (a worker that fails to start is silent)
            raise ConfigError(flag("processing"), problem)
        return PROCESS
    why, level = _why_threads(workers, pickles)
    if why is None:
        return PROCESS
    if why not in _said:
        _said.add(why)
        logger.log(level, "processing on threads (processing auto): %s", why)
    return THREAD


Pickles = list[tuple[object, "bytes | Exception"]]


def _pickled(work: Iterable[object]) -> Pickles:
    """Each callable of ``work`` with its pickle, or what stopped pickling it (a processor pickles its settings,
    not its weights: milliseconds)."""
    pickles: Pickles = []
    for function in work:
        try:
            pickles.append((function, pickle.dumps(function)))
        except Exception as error:  # noqa: BLE001 - whatever stops pickling keeps the work on threads
            pickles.append((function, error))
    return pickles


def _why_threads(workers: int, pickles: Pickles) -> tuple[str | None, int]:
    """Why ``auto`` takes threads (None: it takes processes), and how loudly to say it: a reason the user can
    act on is a warning."""
    if workers < 2:
        return f"{workers} worker: a worker process would make what a thread makes", logging.INFO
    if not worker_start.forked_workers():
        return "worker processes start from the library's server only on POSIX systems with Python 3.11 or 3.12", logging.INFO
    daemonic = _daemonic()
    if daemonic is not None:
        return daemonic, logging.INFO
    for function, pickled in pickles:
        if isinstance(pickled, Exception):
            return f"{function!r} does not pickle ({type(pickled).__name__}: {pickled})", logging.WARNING
    return _main_rerun(pickles), logging.WARNING


def _daemonic() -> str | None:
    """Why this process may not start worker processes: multiprocessing refuses children to a daemonic process
    (one started with ``daemon=True``: a ``DataLoader``'s worker, a pool's)."""
    process = multiprocessing.current_process()
    if process.daemon:
        return f"this process ({process.name}) is daemonic, and a daemonic process may not start worker processes"
    return None


def _main_rerun(pickles: Pickles) -> str | None:
    """The refusal for work that names objects of an unguarded main module (:func:`worker_start.main_rerun_problem`);
    what does not pickle is said where the workers start, as multiprocessing says it."""
    for function, pickled in pickles:
        if isinstance(pickled, bytes) and worker_start.refers_to_main(pickled):
            problem = worker_start.main_rerun_problem(", ".join(worker_start.main_names(pickled)) or repr(function))
            if problem is not None:
                return problem
    return None
