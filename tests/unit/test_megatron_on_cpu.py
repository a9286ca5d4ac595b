"""The test helper that runs megatron-core on CPU ranks (``tests/helpers/megatron_on_cpu.py``) stands in for exactly
the functions it names: when megatron-core changes any of them, this fails, so that the stand-in is looked at again.
Its stand-ins work (CPU tensors, Gloo groups, CPU random states) and are all put back on leaving."""

from __future__ import annotations

import importlib

import pytest
import torch
from megatron_on_cpu import MEGATRON_CORE_RELEASE, PATCHES, TORCH_OF, changed_patches, megatron_on_cpu

from mimo_pipes.megatron.forward import installed_version, release

pytestmark = pytest.mark.skipif(release(installed_version() or "0.0") < (0, 19), reason="the stand-ins are for megatron-core 0.19 (Python 3.12)")


def test_every_stood_in_function_is_as_the_release_it_was_written_for() -> None:
    assert installed_version() == MEGATRON_CORE_RELEASE, "another megatron-core: check every stand-in, then update the release and hashes"
    assert changed_patches() == []


def test_the_check_sees_a_changed_function(monkeypatch: pytest.MonkeyPatch) -> None:
    patch = PATCHES[0]
    module = importlib.import_module(patch.module)
    monkeypatch.setattr(module, patch.function, lambda *args, **kwargs: None)
    changed = changed_patches()
    assert len(changed) == 1 and changed[0].startswith(f"{patch.file}: {patch.function} ")


def test_every_patched_file_is_named_with_its_functions() -> None:
    assert {patch.module for patch in PATCHES} >= set(TORCH_OF)
    assert all(patch.file.startswith("megatron/core/") and patch.assumes for patch in PATCHES)


def test_inside_cuda_means_the_cpu_and_everything_is_put_back() -> None:
    from megatron.core.optimizer import clip_grads
    from megatron.core.tensor_parallel import random
    from megatron.core.transformer import utils

    before = (utils.torch, torch.cuda.current_device, random.CudaRNGStatesTracker.fork, clip_grads.clip_grad_by_total_norm_fp32)
    with megatron_on_cpu():
        assert utils.torch.zeros(2, device="cuda").device.type == "cpu"
        assert torch.cuda.current_device() == "cpu"
        tracker = random.CudaRNGStatesTracker()
        tracker.add("model-parallel-rng", 7)
        with tracker.fork():
            first = torch.rand(3)
        outside = torch.rand(3)
        with tracker.fork():
            second = torch.rand(3)
        assert torch.equal(first, torch.rand(3, generator=torch.Generator().manual_seed(7)))
        assert not torch.equal(first, second) and not torch.equal(outside, first)
        grad = torch.full((4,), 2.0)
        parameter = torch.nn.Parameter(torch.zeros(4))
        parameter.grad = grad
        clip_grads.clip_grad_by_total_norm_fp32([parameter], max_norm=1.0, total_norm=4.0)
        assert torch.allclose(parameter.grad, torch.full((4,), 0.5), rtol=1e-5)
    assert (utils.torch, torch.cuda.current_device, random.CudaRNGStatesTracker.fork, clip_grads.clip_grad_by_total_norm_fp32) == before
