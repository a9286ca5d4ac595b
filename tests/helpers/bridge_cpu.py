"""Megatron-Bridge 0.6.2 imported and run on CPU ranks, for tests only: what Bridge itself assumes beyond what
megatron-core assumes (megatron-core's CUDA assumptions are stood in for by ``megatron_on_cpu``).

Importing Bridge's MIMO path on a machine without CUDA packages (``import_bridge``):

* ``transformer_engine``: ``megatron/bridge/__init__.py`` imports every model bridge, and
  ``training/config.py -> data/builders/direct_hf_sft.py -> models/hf_pretrained -> models/conversion ->
  peft/lora_layers.py`` runs ``import transformer_engine.pytorch as te`` at import time; TransformerEngine only
  builds against CUDA. Stood in for by a module whose every attribute is a placeholder class (one that refuses
  to be made), present only while Bridge imports, so megatron-core (imported first) keeps ``HAVE_TE = False``.
* ``nvidia_resiliency_ext.inprocess``: ``training/pretrain.py`` imports ``CallWrapper`` at import time (the
  in-process restart wrapper the MIMO loop never calls); the PyPI wheel for Python 3.12 (0.4.1) lacks the
  ``__version__`` megatron-core's checkpointing reads, so it is stood in for, the same way. Bridge's other
  NVRx uses (async and local checkpoints) stay off: the stand-in holds no ``checkpointing`` module.

Bridge's own CUDA assumptions on the MIMO loop's path (``BRIDGE_PATCHES``), stood in for by ``bridge_on_cpu``:
each names the Bridge file and function and what it assumes.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

BRIDGE_RELEASE = "0.6.2"
STOOD_IN = ("transformer_engine", "nvidia_resiliency_ext")
"""Top-level packages stood in for while Bridge imports (``nvidia_resiliency_ext``: only it and ``.inprocess``)."""
MEGATRON_CORE_FIRST = (
    "megatron.core.extensions.transformer_engine", "megatron.core.models.mimo", "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.optimizer", "megatron.core.transformer.transformer_config", "megatron.core.dist_checkpointing.strategies.torch",
    "megatron.core.pipeline_parallel.schedules", "modelopt.torch.distill.plugins.megatron",
)
"""megatron-core modules (and modelopt's plugin Bridge's eval module imports) imported before the stand-ins exist,
so that none of them sees a TransformerEngine (modelopt's own check of it would find the stand-in and fail)."""
BRIDGE_MIMO = (
    "megatron.bridge.training.pretrain_megatron_mimo", "megatron.bridge.training.megatron_mimo_step",
    "megatron.bridge.models.megatron_mimo", "megatron.bridge.training.checkpointing",
)


@dataclass(frozen=True)
class BridgePatch:
    """One CUDA assumption of Bridge's MIMO loop: the file, the function, what it assumes and how it is met."""

    file: str
    function: str
    assumes: str
    stand_in: str


BRIDGE_PATCHES = (
    BridgePatch("megatron/bridge/models/megatron_mimo/megatron_mimo_builder.py", "build_infra (HyperCommGrid(..., backend='nccl'))",
                "NCCL groups for every module grid", "HyperCommGrid makes Gloo groups while inside"),
    BridgePatch("megatron/bridge/models/megatron_mimo/megatron_mimo_provider.py", "provide_distributed_model",
                "m.cuda(torch.cuda.current_device())", "MegatronMIMOProvider(use_cpu_initialization=True): a setting, no patch"),
    BridgePatch("megatron/bridge/models/megatron_mimo/build_model.py", "_set_per_module_random_seeds",
                "seeds megatron-core's model-parallel RNG tracker only where torch.cuda.device_count() > 0 (building a layer forks it)",
                "that file's torch.cuda counts one device, so the tracker is seeded (on CPU generators, megatron_on_cpu)"),
    BridgePatch("megatron/bridge/training/setup_megatron_mimo.py", "setup_megatron_mimo",
                'start_time all-reduced as a tensor on device="cuda" (torch imported inside the function)',
                "torch.tensor makes CPU tensors while inside (the function's own import is torch itself)"),
    BridgePatch("megatron/bridge/training/train_megatron_mimo.py", "train_step_megatron_mimo",
                'the loss source rank all-reduced on device="cuda"; the loss dict moved with .cuda()', "that file's torch makes CPU tensors"),
    BridgePatch("megatron/core/timers.py", "Timer.start / Timer.stop, Timers._get_elapsed_time_all_ranks",
                "torch.cuda.synchronize() on every barrier; the ranks' times gathered on torch.cuda.current_device() "
                "(megatron-core's, reached only through Bridge's loop)", "that file's torch makes CPU tensors, synchronizes nothing"),
    BridgePatch("megatron/bridge/training/utils/train_utils.py", "training_log",
                'the running loss sums made on device="cuda"', "that file's torch makes CPU tensors"),
    BridgePatch("megatron/bridge/training/checkpointing.py", "get_rng_state, read_metadata, _load_checkpoint_from_path",
                "the CUDA generator's state saved and restored (torch.cuda.get_rng_state / set_rng_state); the tracker's "
                'iteration all-reduced on device="cuda"',
                "that file's torch makes CPU tensors; its CUDA generator is the CPU one (saved beside it as torch_rng_state)"),
    BridgePatch("megatron/core/dist_checkpointing/strategies/{filesystem_async,async_utils,state_dict_saver,fully_parallel}.py",
                "FileSystemWriterAsync.preload_tensors, the save's verification and its completion checks",
                "torch.cuda.synchronize(); flags all-reduced on torch.cuda.current_device() (megatron-core's torch_dist save, "
                "reached through Bridge's save_checkpoint)", "those files' torch makes CPU tensors, synchronizes nothing"),
    BridgePatch("megatron/bridge/training/megatron_mimo_step.py", "get_batch._move_to_cuda",
                "every batch tensor moved with .cuda()", "not called: mimo_pipes_recipes.megatron_bridge.forward_step moves to the CPU"),
)


class _Refuses(type):
    """A placeholder class: any attribute is another placeholder; making one is refused, naming it."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")


def _placeholder(name: str) -> type:
    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{name} is a test stand-in (TransformerEngine is not installed)")

    return _Refuses(name.rsplit(".", 1)[-1], (), {"__init__": refuse, "__qualname__": name})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``transformer_engine.*`` and ``nvidia_resiliency_ext.inprocess`` as stand-in modules."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] == "transformer_engine" or fullname in ("nvidia_resiliency_ext", "nvidia_resiliency_ext.inprocess"):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def import_bridge() -> types.ModuleType:
    """Bridge's MIMO modules imported with the stand-ins above (present only during the import); returns
    ``megatron.bridge.training.pretrain_megatron_mimo``. ImportError when Bridge is not installed."""
    import logging

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in MEGATRON_CORE_FIRST:
            importlib.import_module(name)
        finder = _StandIns()
        sys.meta_path.insert(0, finder)
        quiet = logging.getLogger("megatron.bridge.utils.import_utils")
        level, quiet.level = quiet.level, logging.ERROR  # Bridge logs every optional import that fails, with its traceback
        try:
            for name in BRIDGE_MIMO:
                importlib.import_module(name)
        finally:
            quiet.level = level
            sys.meta_path.remove(finder)
            for name in [name for name in sys.modules if name.split(".")[0] in STOOD_IN]:
                sys.modules.pop(name)
    return sys.modules[BRIDGE_MIMO[0]]


@contextlib.contextmanager
def bridge_on_cpu() -> Iterator[None]:
    """``BRIDGE_PATCHES`` stood in for while inside, with megatron-core's (``megatron_on_cpu``)."""
    from megatron.bridge.models.megatron_mimo import build_model
    from megatron.bridge.training import checkpointing, train_megatron_mimo
    from megatron.bridge.training.utils import train_utils
    from megatron.core import timers
    from megatron.core.dist_checkpointing.strategies import async_utils, filesystem_async, fully_parallel, state_dict_saver
    from megatron.core.hyper_comm_grid import HyperCommGrid
    from megatron_on_cpu import CpuTorch, _swapped, megatron_on_cpu

    made = HyperCommGrid.__init__

    def gloo_grid(self: Any, *args: Any, **kwargs: Any) -> None:  # the builder imports HyperCommGrid inside build_infra
        made(self, *args, **{**kwargs, "backend": "gloo"})

    cpu_torch = CpuTorch()
    cpu_generator = CpuTorch()  # the CPU run's only generator stands for the CUDA one Bridge saves and restores
    cpu_generator.cuda.get_rng_state = torch.get_rng_state
    cpu_generator.cuda.set_rng_state = torch.set_rng_state
    one_device = CpuTorch()
    one_device.cuda.device_count = lambda: 1
    with contextlib.ExitStack() as stack:
        stack.enter_context(_swapped(build_model, "torch", one_device))
        stack.enter_context(megatron_on_cpu())
        for module in (train_megatron_mimo, train_utils, timers, filesystem_async, async_utils, state_dict_saver, fully_parallel):
            stack.enter_context(_swapped(module, "torch", cpu_torch))
        stack.enter_context(_swapped(checkpointing, "torch", cpu_generator))
        stack.enter_context(_swapped(torch, "tensor", cpu_torch.tensor))
        stack.enter_context(_swapped(HyperCommGrid, "__init__", gloo_grid))
        yield

