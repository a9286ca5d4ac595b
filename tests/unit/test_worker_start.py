"""The library's worker processes start from its own forkserver (mimo_pipes/samples/worker_start.py):
forked from a server that imported the workers' modules once, and given what a spawned worker gets."""

from __future__ import annotations

import os
import pickle
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

from mimo_pipes.samples.worker_start import worker_context

VARIABLE = "MIMO_PIPES_WORKER_START_CHECK"
HEAVY = ("torch", "transformers.image_processing_utils")  # a worker's heaviest imports (worker_preload.py)


def facts(_: object = None) -> dict:
    """In a worker: what it was started with."""
    imported = [name for name in HEAVY if name in sys.modules]  # before this function imports torch itself
    import torch

    return {"parent": os.getppid(), "variable": os.environ.get(VARIABLE), "cwd": os.getcwd(), "imported": imported,
            "torch_threads": torch.get_num_threads()}


@pytest.mark.launch  # starts worker processes
def test_workers_are_forked_from_one_preloaded_server_with_this_processs_environment(monkeypatch, tmp_path):
    context = worker_context()
    assert context.get_start_method() == "forkserver"
    monkeypatch.delenv(VARIABLE, raising=False)
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        first = pool.submit(facts).result()
    # Set after the server started: the next worker still has it, as a spawned one would; and this folder.
    monkeypatch.setenv(VARIABLE, "set later")
    monkeypatch.chdir(tmp_path)
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        second = pool.submit(facts).result()
        with pytest.raises((pickle.PicklingError, AttributeError)):  # what cannot be pickled fails as with spawn
            pool.submit(facts, lambda: None).result()
    assert first["variable"] is None and second["variable"] == "set later"
    # torch on the worker's own thread (as DataLoader's workers): 14 workers do not each run a team of threads.
    assert first["torch_threads"] == second["torch_threads"] == 1
    assert second["cwd"] == str(tmp_path)
    assert first["parent"] == second["parent"] != os.getpid()  # one server forked both
    # Unpickling facts imports this module, which imports neither: the server did, before it forked.
    assert first["imported"] == list(HEAVY)
