"""A rank lost during ``save_pipeline_state`` (launch tier: real Gloo ranks, one of them dies): ranks that joined
their process group themselves, as a Megatron loop under torchrun does (the job's store outlives every rank), save
the pipeline's state; one dies in the middle of writing its part. Every other rank raises the save's one-line
ConfigError naming ``--save`` and the rank that died, never Gloo's raw text, and nothing becomes the folder's state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mimo_pipes.checkpoint import open_generation
from mimo_pipes.errors import ConfigError
from mimo_pipes.exchange.roll_store import host_store
from mimo_pipes.megatron.checkpoint import pipeline_state_folder

pytestmark = pytest.mark.launch

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
ROOT = Path(__file__).resolve().parents[2]
RANKS = 3


@pytest.mark.parametrize("victim", [0, 2], ids=["committer", "last"])
def test_a_rank_lost_during_the_save_is_named_in_one_line_on_every_survivor(tmp_path, victim):
    store, port = host_store()  # torchrun's agent hosts the job's store so; ranks join it as clients
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True",
           "WORLD_SIZE": str(RANKS), "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), str(HELPERS)])}
    ranks = [subprocess.Popen([sys.executable, str(HELPERS / "save_rank_lost.py"), "--rank", str(rank), "--world-size", str(RANKS),
                               "--victim", str(victim), "--checkpoint", str(tmp_path)], env={**env, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(RANKS)]
    try:
        outputs = [process.communicate(timeout=240) for process in ranks]
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
        del store
    assert ranks[victim].returncode == 9, outputs[victim]
    for rank in set(range(RANKS)) - {victim}:
        stdout, stderr = outputs[rank]
        assert ranks[rank].returncode == 0, stderr
        said = json.loads(stdout.strip().splitlines()[-1])
        assert said["type"] == "ConfigError", said
        message = said["message"]
        assert "\n" not in message and message.startswith("--save: the pipeline state of iteration 1 was not saved"), message
        assert message.endswith(f"; rank {victim} died (its process ended without a word: killed or crashed)"), message
        assert "pair.cc" not in message and "gloo" not in message.lower() and "[127.0.0.1]" not in message, message
    with pytest.raises(ConfigError):  # nothing of the save became the folder's state
        open_generation(pipeline_state_folder(tmp_path, 1))
