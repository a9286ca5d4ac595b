"""The Megatron recipes' training device: CUDA over NCCL by default, the CPU over Gloo on request, a machine without
a GPU refused in one line naming ``--device``."""

from __future__ import annotations

import pytest
import torch

from mimo_pipes.megatron.device import TrainingDevice


def test_cuda_over_nccl_is_the_default_and_the_cpu_goes_over_gloo() -> None:
    assert (TrainingDevice().kind, TrainingDevice().backend) == ("cuda", "nccl")
    cpu = TrainingDevice("cpu")
    assert (cpu.backend, cpu.torch_device(), cpu.gpus(), cpu.peak_memory_gib(), cpu.problem()) == ("gloo", torch.device("cpu"), 0, None, None)
    cpu.synchronize()  # nothing to wait for


def test_an_unknown_device_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match=r"^--device: one of cuda, cpu, got 'tpu'$"):
        TrainingDevice("tpu")


def test_cuda_without_a_gpu_is_refused_in_one_line_pointing_at_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    problem = TrainingDevice("cuda").problem()
    assert problem is not None and problem.startswith("--device cuda: no CUDA GPU found") and "--device cpu" in problem and "\n" not in problem
