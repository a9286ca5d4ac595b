"""A module's model and optimizer part in Megatron's iteration folder: written by the module's first data-parallel
replica under Megatron-LM's model-parallel rank name, loaded back by any data-parallel replica of the same tp and pp
sizes; a part saved with other sizes, or missing, is refused naming --load. (Stand-in groups: only ranks and sizes
are read.)"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from mimo_pipes.errors import ConfigError
from mimo_pipes.megatron.model_state import load_model_state, model_state_file, save_model_state


@dataclass
class Group:
    rank_: int = 0
    size_: int = 1

    def rank(self) -> int:
        return self.rank_

    def size(self) -> int:
        return self.size_


@dataclass
class Groups:
    tp: Group
    pp: Group
    dp_cp: Group


def groups(tp=(0, 1), pp=(0, 1), dp=(0, 1)) -> Groups:
    return Groups(Group(*tp), Group(*pp), Group(*dp))


def trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).square().sum().backward()
    optimizer.step()
    return model, optimizer


def test_the_first_replica_saves_and_another_replica_loads_the_same_state(tmp_path):
    model, optimizer = trained(1)
    assert save_model_state(tmp_path, 7, module="language", pgs=groups(tp=(1, 2), dp=(1, 2)), model=model, optimizer=optimizer) is None
    path = save_model_state(tmp_path, 7, module="language", pgs=groups(tp=(1, 2)), model=model, optimizer=optimizer)
    assert path == tmp_path / "iter_0000007" / "language" / "mp_rank_01_000" / "model_optim.pt" == model_state_file(tmp_path, 7, "language", groups(tp=(1, 2)))
    assert [p.name for p in path.parent.iterdir()] == ["model_optim.pt"]  # nothing left aside
    fresh, fresh_optimizer = trained(2)
    load_model_state(tmp_path, 7, module="language", pgs=groups(tp=(1, 2), dp=(3, 4)), model=fresh, optimizer=fresh_optimizer)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    saved, loaded = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
    assert all(torch.equal(saved[i][key], loaded[i][key]) for i in saved for key in saved[i])


@pytest.mark.parametrize(("here", "problem"), [
    ({"tp": (0, 1)}, r"iteration 3 holds no images model state for tensor-parallel rank 0 and pipeline stage 0"),
    ({"tp": (1, 4)}, r"was saved with images tp 2 pp 1, this run has tp 4 pp 1: only the data-parallel sizes may change"),
    ({"tp": (1, 2), "pp": (0, 2)}, r"was saved with images tp 2 pp 1, this run has tp 2 pp 2: only the data-parallel sizes may change"),
])
def test_a_part_of_other_sizes_is_refused_naming_load(tmp_path, here, problem):
    model, optimizer = trained(1)
    save_model_state(tmp_path, 3, module="images", pgs=groups(tp=(1, 2)), model=model, optimizer=optimizer)
    with pytest.raises(ConfigError, match=problem) as error:
        load_model_state(tmp_path, 3, module="images", pgs=groups(**here), model=model, optimizer=optimizer)
    assert error.value.setting == "--load" and "\n" not in str(error.value)
