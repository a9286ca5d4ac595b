"""Every module's common optimizer state in a megatron-core ``torch_dist`` checkpoint, not global rank 0's alone.

megatron-core's ``dist_checkpointing.save`` writes the common part of a state dict (whatever is not a sharded tensor
or object) from global rank 0 only, and every rank loads that one copy. In a non-colocated ``MimoModel`` global rank
0 holds one module, so the other modules' common optimizer state is lost. ``MimoOptimizer.sharded_state_dict``
(megatron-core 0.19) moves ``param_groups`` into sharded objects only where they sit in an ``optimizer`` sub-dict
(the mixed-precision and distributed optimizers); an fp32 ``FP32Optimizer`` keeps its ``param_groups`` and Adam's
``common_step`` at the top, so a language rank resuming fails in ``MimoOptimizer.load_state_dict`` (``Could not
find parameter group``).

:class:`ModuleCommonOptimizerState` stands for a ``MimoOptimizer`` in a checkpoint's save and load: each active
module's common part travels as one sharded object of its own, keyed by module, pipeline stage and tensor-parallel
rank (the module's data-parallel and context-parallel replicas hold the same one), and is put back, as
``dist_checkpointing.load`` merges common and sharded parts, before the ``MimoOptimizer`` loads. The rest is the
``MimoOptimizer``'s own. megatron-core is imported inside the calls only.
"""

from __future__ import annotations

from typing import Any

COMMON = "_mimo_pipes_common"
"""The key of a module's common optimizer state among its sharded entries."""


def is_mimo_optimizer(optimizer: Any) -> bool:
    from megatron.core.models.mimo.optimizer import MimoOptimizer

    return isinstance(optimizer, MimoOptimizer)


def common_as_sharded(module_state: dict, module: str, pg_collection: Any) -> dict:
    """``module_state`` (one module's sharded optimizer state) with its common part moved into one sharded object.
    Local non-persistent objects (the parameter ids of ``param_groups``) stay where ``dist_checkpointing`` fills
    them in on load."""
    from megatron.core.dist_checkpointing.dict_utils import extract_matching_values
    from megatron.core.dist_checkpointing.mapping import LocalNonpersistentObject, ShardedBase, ShardedObject

    sharded, common = extract_matching_values(module_state, lambda value: isinstance(value, (ShardedBase, LocalNonpersistentObject)))
    pp, tp = pg_collection.pp, pg_collection.tp
    sharded[COMMON] = ShardedObject(f"optimizer.mimo_pipes.{module}.common", common, (pp.size(), tp.size()), (pp.rank(), tp.rank()),
                                    replica_id=pg_collection.dp_cp.rank())
    return sharded


def common_restored(module_state: dict) -> dict:
    """``module_state`` as loaded, its common part (saved by :func:`common_as_sharded`) merged back in place."""
    from megatron.core.dist_checkpointing.dict_utils import merge

    common = module_state.pop(COMMON, None)
    return module_state if common is None else merge(module_state, common)


class ModuleCommonOptimizerState:
    """A ``MimoOptimizer`` as a checkpoint's save and load see it: each module's common state sharded by module."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer_of_modules = optimizer

    def __getattr__(self, name: str) -> Any:  # everything else is the MimoOptimizer's
        if name == "optimizer_of_modules":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.optimizer_of_modules, name)

    def sharded_state_dict(self, model_sharded_state_dict: Any, is_loading: bool = False, **kwargs: Any) -> dict:
        state = self.optimizer_of_modules.sharded_state_dict(model_sharded_state_dict, is_loading, **kwargs)
        for module, info in self.optimizer_of_modules.module_infos.items():
            if info.is_active and info.optimizer is not None and state.get(module):
                state[module] = common_as_sharded(state[module], module, info.pg_collection)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        restored = {module: common_restored(state) if isinstance(state, dict) else state for module, state in state_dict.items()}
        self.optimizer_of_modules.load_state_dict(restored)


def with_every_module_common_state(optimizer: Any) -> Any:
    """``optimizer`` for a checkpoint call: wrapped when it is a ``MimoOptimizer``, else as it is."""
    return ModuleCommonOptimizerState(optimizer) if optimizer is not None and is_mimo_optimizer(optimizer) else optimizer
