"""A Megatron recipe's model and optimizer inside Megatron's iteration folder, beside the pipeline's state
(:mod:`mimo_pipes.megatron.checkpoint`), committed with it.

Each module's first data-parallel replica writes its tensor-parallel rank's and pipeline stage's part:
``SAVE/iter_{k:07d}/{module}/mp_rank_{tp:02d}_{pp:03d}/model_optim.pt`` (Megatron-LM's name for a model-parallel
rank's folder, one per module), the module's ``state_dict`` and the ``MimoOptimizer``'s, before the iteration is
committed. A run with the same tensor- and pipeline-parallel sizes per module loads it on any number of
data-parallel replicas (the replicas hold equal weights and, without a distributed optimizer, equal optimizer
state). Changing tp or pp needs a resharding format (megatron-core's dist_checkpointing, which assumes CUDA);
a file saved with other sizes is refused naming ``--load``.

Torch files and the module's own process groups only: nothing here talks to other ranks (the pipeline's
collective save, called after this, is what every rank waits on before the commit)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from mimo_pipes.errors import ConfigError
from mimo_pipes.megatron.checkpoint import LOAD, iteration_folder

MODEL_FILE = "model_optim.pt"


def model_state_file(checkpoint_dir: str | Path, iteration: int, module: str, pgs: Any) -> Path:
    """Where ``module``'s part on this rank's tensor-parallel rank and pipeline stage (``pgs``: the module's
    ``ProcessGroupCollection``) lies in iteration ``iteration``'s folder."""
    return iteration_folder(checkpoint_dir, iteration) / module / f"mp_rank_{pgs.tp.rank():02d}_{pgs.pp.rank():03d}" / MODEL_FILE


def _sizes(pgs: Any) -> dict[str, int]:
    return {"tp": pgs.tp.size(), "pp": pgs.pp.size()}


def save_model_state(checkpoint_dir: str | Path, iteration: int, *, module: str, pgs: Any, model: torch.nn.Module, optimizer: Any) -> Path | None:
    """This rank's part of ``module`` (``model``: the module unwrapped from its DDP) and ``optimizer``'s state,
    written by the module's first data-parallel replica (the others return None); written aside and renamed
    into place, so a kill leaves no cut file under the name."""
    if pgs.dp_cp.rank() != 0:
        return None
    path = model_state_file(checkpoint_dir, iteration, module, pgs)
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{MODEL_FILE}.{os.getpid()}")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "sizes": _sizes(pgs)}, aside)
    os.replace(aside, path)
    return path


def load_model_state(checkpoint_dir: str | Path, iteration: int, *, module: str, pgs: Any, model: torch.nn.Module, optimizer: Any) -> None:
    """``module``'s part saved at ``iteration`` into ``model`` (unwrapped from its DDP) and ``optimizer``;
    ConfigError naming ``--load`` when it is missing or was saved with other tp or pp sizes."""
    path = model_state_file(checkpoint_dir, iteration, module, pgs)
    if not path.is_file():
        raise ConfigError(LOAD, f"{path} is missing: iteration {iteration} holds no {module} model state for tensor-parallel rank "
                                f"{pgs.tp.rank()} and pipeline stage {pgs.pp.rank()} (only the data-parallel sizes may change on a resume)")
    state = torch.load(path, map_location="cpu", weights_only=False)  # our own file: the optimizer's state holds plain objects
    if state["sizes"] != _sizes(pgs):
        saved, here = state["sizes"], _sizes(pgs)
        raise ConfigError(LOAD, f"{path} was saved with {module} tp {saved['tp']} pp {saved['pp']}, this run has tp {here['tp']} pp "
                                f"{here['pp']}: only the data-parallel sizes may change on a resume")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
