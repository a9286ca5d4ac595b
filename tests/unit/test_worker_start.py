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


PROGRAM = """
import os
from mimo_pipes.config import PipelineConfig
from mimo_pipes.exchange import RankLayout
from mimo_pipes_recipes import vlm_sft

config = PipelineConfig(components=("language=dp=1",), micro_batch_size=2, num_workers=2,
                        processing="process", embedded_samples=16, exchange_payload=PAYLOAD)
"""
LIBRARY_STEP = """
loader = vlm_sft.build(config, RankLayout(0, 1, 1))
batch = next(iter(loader))
loader.close()
print("micro-batch", batch["sample_ids"], "in", os.getpid())
"""
OWN_STEP = """
from mimo_pipes.data.from_config import dataset_path, open_processor
from mimo_pipes.data.sources.open_source import open_source

processor = open_processor(config)

def own_step(row):
    return processor(row)

loader = vlm_sft.pipeline(open_source(dataset_path(config), "train"), config, RankLayout(0, 1, 1), map_fn=own_step,
                          image_token_id=processor.placeholder_ids, pad_values={"input_ids": processor.pad_token_id},
                          vision_fields=processor.vision_fields)
"""


@pytest.mark.launch  # runs programs that start worker processes
def test_a_program_without_a_main_guard_runs_the_librarys_processing_on_processes(tmp_path):
    """Its workers never import it (nothing they run is of it): it runs once, as with threads; one whose own
    function the workers must run is refused in one line, naming it and the setting, before any worker starts."""
    import subprocess

    runs = {}
    for name, payload, text in (("library", "rows", LIBRARY_STEP), ("samples", "samples", LIBRARY_STEP), ("own", "samples", OWN_STEP)):
        program = tmp_path / f"{name}.py"
        program.write_text(PROGRAM.replace("PAYLOAD", repr(payload)) + text)
        runs[name] = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    for name in ("library", "samples"):
        result = runs[name]
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.count("micro-batch") == 1, result.stdout
    own = runs["own"]
    assert own.returncode == 1
    last = own.stderr.strip().splitlines()[-1]
    assert "ConfigError: processing: worker processes" in last and "run own_step of" in last and "own.py" in last, own.stderr[-2000:]
