"""Each module's common optimizer state as a sharded object of its own (``mimo_pipes.megatron.optimizer_common``):
nothing of a module's optimizer state is left to the common part ``torch_dist`` writes from global rank 0 alone, and
what a load hands back (sharded tensors and objects loaded, local non-persistent objects unwrapped, as
``dist_checkpointing.load`` does) is restored to the state the optimizer gave, for any number of parameter groups."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

mapping = pytest.importorskip("megatron.core.dist_checkpointing.mapping")

from mimo_pipes.megatron.optimizer_common import (  # noqa: E402 - after the skip: megatron-core is optional
    COMMON,
    ModuleCommonOptimizerState,
    common_as_sharded,
    common_restored,
    with_every_module_common_state,
)


class Group:
    """A process group's rank and size, as a ``ProcessGroupCollection`` member answers them."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def groups(*, tp: tuple[int, int] = (0, 1), pp: tuple[int, int] = (0, 1), dp_cp: tuple[int, int] = (0, 1)) -> SimpleNamespace:
    return SimpleNamespace(tp=Group(*tp), pp=Group(*pp), dp_cp=Group(*dp_cp))


def fp32_state(group_sizes: list[int], step: int | None, module: str = "language") -> dict:
    """An fp32 ``FP32Optimizer``'s sharded state dict as megatron-core builds it: Adam's moments as sharded tensors,
    each group's parameter ids a local non-persistent object, the rest (hyper-parameters, ``common_step``) plain."""
    state: dict = {}
    param_groups = []
    index = 0
    for number, size in enumerate(group_sizes):
        ids = list(range(index, index + size))
        index += size
        param_groups.append({"lr": 1e-3 * (number + 1), "weight_decay": 0.01 * number, "betas": (0.9, 0.999), "params": mapping.LocalNonpersistentObject(ids)})
        for param in ids:
            state[param] = {moment: mapping.ShardedTensor.from_rank_offsets(f"{module}.{moment}.{param}", torch.full((2,), float(param)))
                            for moment in ("exp_avg", "exp_avg_sq")}
    if step is not None:
        state["common_step"] = torch.tensor(float(step))
    return {"state": state, "param_groups": param_groups}


def as_loaded(value):
    """What ``dist_checkpointing.load`` hands back for a sharded state dict: sharded tensors and objects loaded (here:
    their data), local non-persistent objects unwrapped."""
    if isinstance(value, dict):
        return {key: as_loaded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_loaded(item) for item in value]
    if isinstance(value, mapping.LocalNonpersistentObject):
        return value.unwrap()
    if isinstance(value, (mapping.ShardedTensor, mapping.ShardedObject)):
        return copy.deepcopy(value.data)
    return value


def leaves(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from leaves(item)
    else:
        yield value


def same(left, right) -> bool:
    if isinstance(left, dict):
        return isinstance(right, dict) and left.keys() == right.keys() and all(same(left[key], right[key]) for key in left)
    if isinstance(left, (list, tuple)):
        return type(left) is type(right) and len(left) == len(right) and all(same(a, b) for a, b in zip(left, right))
    if isinstance(left, torch.Tensor):
        return isinstance(right, torch.Tensor) and torch.equal(left, right)
    return left == right


@settings(max_examples=40, deadline=None)
@given(group_sizes=st.lists(st.integers(1, 3), min_size=1, max_size=3), step=st.none() | st.integers(1, 50))
def test_a_module_state_round_trips_with_nothing_left_common(group_sizes, step):
    saved = common_as_sharded(fp32_state(group_sizes, step), "language", groups())
    assert all(isinstance(leaf, (mapping.ShardedBase, mapping.LocalNonpersistentObject)) for leaf in leaves(saved))
    assert [sorted(group) for group in saved["param_groups"]] == [["params"]] * len(group_sizes)  # the ids stay for the load
    restored = common_restored(as_loaded(saved))
    assert same(restored, as_loaded(fp32_state(group_sizes, step)))


def test_the_sharded_object_is_keyed_by_module_stage_and_tensor_rank_and_replicated_over_data_parallel_ranks():
    saved = common_as_sharded(fp32_state([2], 7), "language", groups(tp=(1, 2), pp=(2, 4), dp_cp=(3, 4)))[COMMON]
    assert isinstance(saved, mapping.ShardedObject)
    assert (saved.key, saved.global_shape, saved.global_offset, saved.replica_id) == ("optimizer.mimo_pipes.language.common", (4, 2), (2, 1), 3)
    assert saved.data["state"]["common_step"] == 7 and saved.data["param_groups"][0]["lr"] == 1e-3


class StandInMimoOptimizer:
    """megatron-core's ``MimoOptimizer`` as the wrapper reads it: per-module infos, a sharded state dict per module
    (an inactive module's empty), and the per-module state dict its load takes."""

    def __init__(self) -> None:
        self.module_infos = {"images": SimpleNamespace(is_active=False, optimizer=None, pg_collection=None),
                             "language": SimpleNamespace(is_active=True, optimizer=object(), pg_collection=groups())}
        self.loaded = None
        self.is_stub_optimizer = False

    def sharded_state_dict(self, model_sharded_state_dict, is_loading=False, **kwargs):
        return {"images": {}, "language": fp32_state([1, 2], 3)}

    def load_state_dict(self, state_dict):
        self.loaded = state_dict


def test_the_wrapper_shards_the_active_modules_common_state_and_restores_it_before_the_optimizer_loads():
    optimizer = StandInMimoOptimizer()
    wrapped = ModuleCommonOptimizerState(optimizer)
    saved = wrapped.sharded_state_dict({}, is_loading=True, metadata={})
    assert saved["images"] == {} and COMMON in saved["language"]
    assert wrapped.is_stub_optimizer is False  # everything else is the optimizer's
    wrapped.load_state_dict(as_loaded(saved))
    assert same(optimizer.loaded, {"images": {}, "language": as_loaded(fp32_state([1, 2], 3))})


def test_only_a_mimo_optimizer_is_wrapped():
    MimoOptimizer = pytest.importorskip("megatron.core.models.mimo.optimizer").MimoOptimizer  # megatron-core 0.19 on

    plain = object()
    assert with_every_module_common_state(plain) is plain and with_every_module_common_state(None) is None
    mimo = MimoOptimizer({}, config=SimpleNamespace())
    assert isinstance(with_every_module_common_state(mimo), ModuleCommonOptimizerState)
