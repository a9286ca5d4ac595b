"""megatron-core 0.19.2 on CPU ranks over Gloo, for tests only: every CUDA assumption of megatron-core that the
Megatron recipes meet on ``--device cpu``, stood in for while inside :func:`megatron_on_cpu`, and put back after.

The library and the recipes never patch megatron-core: on CUDA GPUs they need none of this. Each entry of
``PATCHES`` names the megatron-core file and function whose CUDA assumption is stood in for, with the SHA-256 of
that function's source in the release these patches were written against: ``tests/unit/test_megatron_on_cpu.py``
fails when megatron-core changes any of them, so that the stand-in is looked at again, never silently stale.

How each is stood in for:

* a file's own ``torch`` (``device="cuda"`` literals, ``torch.cuda.current_device()``, streams): the module's global
  ``torch`` replaced by :class:`CpuTorch`, torch with CUDA meaning the CPU (tensor factories' ``device`` argument,
  ``torch.cuda.current_device()``, ``current_stream()`` / ``Stream`` as no-op streams);
* ``torch.cuda.current_device`` itself, for the files that reach it through ``torch.cuda`` without a ``torch`` of
  their own to replace (tensor_parallel's layers and mappings): ``"cpu"``;
* ``backend='nccl'`` in the bridge's groups: that file's ``dist`` replaced by one whose groups are Gloo's;
* the CUDA RNG tracker: its ``add`` and ``fork`` keep and swap CPU generator states;
* clip_grads' ``torch.cuda.FloatTensor`` assertion: the function replaced by a CPU one (the same arithmetic:
  gradients times ``max_norm / (total_norm + 1e-6)`` where that is below 1);
* the local layer spec's attention (``DotProductAttention.forward``), which refuses packed sequences (THD,
  ``packed_seq_params``) because only TransformerEngine's attention, CUDA-only, takes them: :func:`thd_attention`
  computes what TE's THD attention does (each packed sequence causal on its own, no attention across sequences,
  each sequence's padding to the pack multiple left out and given zeros) and hands everything else to the local
  attention as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

MEGATRON_CORE_RELEASE = "0.19.2"


@dataclass(frozen=True)
class Patch:
    """One CUDA assumption of megatron-core: ``module`` (its file: ``module`` with dots as slashes), the function
    holding it (``Class.method`` for a method), what it assumes, and the SHA-256 (first 16 hex digits) of that
    function's source in ``MEGATRON_CORE_RELEASE``."""

    module: str
    function: str
    assumes: str
    source_sha: str

    @property
    def file(self) -> str:
        return self.module.replace(".", "/") + ".py"

    def target(self) -> Callable:
        owner: Any = importlib.import_module(self.module)
        for part in self.function.split("."):
            owner = getattr(owner, part)
        return owner


def source_sha(function: Callable) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


PATCHES = (
    Patch("megatron.core.pipeline_parallel.schedules", "forward_backward_no_pipelining", 'total_num_tokens on device="cuda"', "b52848b05720fd61"),
    Patch("megatron.core.pipeline_parallel.schedules", "forward_backward_pipelining_without_interleaving",
          'total_num_tokens on device="cuda"', "772d6b7d81825e7a"),
    Patch("megatron.core.models.mimo.optimizer", "MimoOptimizer.step", 'found_inf and success on device="cuda"', "b94c7151c14f89f1"),
    Patch("megatron.core.models.mimo.optimizer", "MimoOptimizer.get_grad_norm", 'per-module norms on device="cuda"', "e9d577bfcae5757f"),
    Patch("megatron.core.optimizer.clip_grads", "get_grad_norm_fp32", "the norm on device='cuda'", "810944e99b1e435d"),
    Patch("megatron.core.optimizer.clip_grads", "clip_grad_by_total_norm_fp32",
          "asserts every grad is a torch.cuda.FloatTensor; its overflow buffer on device='cuda'", "cf07b488fb76a8ae"),
    Patch("megatron.core.optimizer.optimizer", "FP32Optimizer.__init__", "its loss scale on device='cuda'", "4936aab887728fbb"),
    Patch("megatron.core.optimizer.optimizer", "ChainedOptimizer.get_loss_scale", "on torch.cuda.current_device()", "c08af88e62d7fe38"),
    Patch("megatron.core.utils", "local_multi_tensor_l2_norm", 'the norm on device="cuda"', "01526c55444a73bd"),
    Patch("megatron.core.transformer.utils", "get_default_causal_mask", 'the mask on device="cuda"', "4638b2c6665fc284"),
    Patch("megatron.core.pipeline_parallel.bridge_communicator", "BridgeCommunicator._get_or_create_broadcast_pg",
          "its groups made with backend='nccl'", "c752e2eab00c813c"),
    Patch("megatron.core.pipeline_parallel.bridge_communicator", "BridgeCommunicator._get_or_create_bridge_pg",
          "its groups made with backend='nccl'", "82a2bc069a4de980"),
    Patch("megatron.core.pipeline_parallel.bridge_communicator", "BridgeCommunicator.recv_forward", "buffers on torch.cuda.current_device()",
          "eba8f4f457ce75cb"),
    Patch("megatron.core.pipeline_parallel.bridge_communicator", "BridgeCommunicator.recv_backward", "buffers on torch.cuda.current_device()",
          "0550bbb99f3f3f5c"),
    Patch("megatron.core.pipeline_parallel.bridge_communicator", "BridgeCommunicator.send_forward_recv_backward", "buffers on torch.cuda.current_device()",
          "eff3046b45f4c225"),
    Patch("megatron.core.pipeline_parallel.bridge_communicator", "BridgeCommunicator.send_backward_recv_forward", "buffers on torch.cuda.current_device()",
          "f5375d077ccfafc7"),
    Patch("megatron.core.pipeline_parallel.bridge_communicator", "BridgeCommunicator._communicate_shapes", "buffers on torch.cuda.current_device()",
          "522553b2bc0c597e"),
    Patch("megatron.core.pipeline_parallel.p2p_communication", "P2PCommunicator._communicate_shapes",
          "shapes on torch.cuda.current_device()", "64129c790b8b6e3d"),
    Patch("megatron.core.pipeline_parallel.p2p_communication", "P2PCommunicator._communicate",
          "receive buffers on torch.cuda.current_device()", "a902480caa75a260"),
    Patch("megatron.core.distributed.param_and_grad_buffer", "_ParamAndGradBucketGroup.start_grad_sync",
          "torch.cuda.current_stream()", "62f8f12d579769ef"),
    Patch("megatron.core.models.mimo.model.base", "MimoModel._empty_encoder_output", "sizes on torch.cuda.current_device()", "07da6f4981339eed"),
    Patch("megatron.core.tensor_parallel.random", "CudaRNGStatesTracker.add", "torch.cuda.get_rng_state()", "e5e9ab39a7c1e085"),
    Patch("megatron.core.tensor_parallel.random", "CudaRNGStatesTracker.fork", "the CUDA generator's state", "6821e1e397253d43"),
    Patch("megatron.core.transformer.dot_product_attention", "DotProductAttention.forward",
          "refuses packed_seq_params (THD): only TransformerEngine's attention, CUDA-only, takes packed sequences", "1450046fe34ea330"),
)
"""What is stood in for, by file and function. (A stand-in by module covers every function of that file.)"""

TORCH_OF = ("megatron.core.pipeline_parallel.schedules", "megatron.core.models.mimo.optimizer", "megatron.core.optimizer.clip_grads",
            "megatron.core.utils", "megatron.core.transformer.utils", "megatron.core.pipeline_parallel.bridge_communicator",
            "megatron.core.pipeline_parallel.p2p_communication", "megatron.core.distributed.param_and_grad_buffer",
            "megatron.core.models.mimo.model.base", "megatron.core.optimizer.optimizer")
"""The files whose own ``torch`` is replaced by :class:`CpuTorch` (their rows in ``PATCHES``)."""


# ------------------------------------------------------------------------------------------- stand-ins


def _cpu(device: Any) -> Any:
    """A CUDA device (``"cuda"``, ``"cuda:1"``, an index, a CUDA ``torch.device``) as the CPU; any other as it is."""
    if isinstance(device, int) or (isinstance(device, str) and device.startswith("cuda")):
        return "cpu"
    if isinstance(device, torch.device) and device.type == "cuda":
        return "cpu"
    return device


def _on_cpu(factory: Callable) -> Callable:
    def made(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return factory(*args, **kwargs)

    return made


class _NoStream:
    """A CUDA stream's interface, doing nothing (the CPU runs in order)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_event(self, *args: Any) -> None:
        pass

    def wait_stream(self, *args: Any) -> None:
        pass

    def record_event(self, *args: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


class CpuCuda(types.ModuleType):
    """``torch.cuda`` as a patched file sees it: its current device is the CPU, its streams do nothing."""

    def __init__(self) -> None:
        super().__init__("torch.cuda")
        self.current_device = lambda: "cpu"
        self.current_stream = lambda *args, **kwargs: _NoStream()
        self.Stream = _NoStream
        self.synchronize = lambda *args, **kwargs: None
        self.stream = lambda *args, **kwargs: contextlib.nullcontext()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


FACTORIES = ("zeros", "ones", "empty", "full", "tensor", "arange", "randn", "rand", "zeros_like", "ones_like", "empty_like")


class CpuTorch(types.ModuleType):
    """``torch`` as a patched file sees it: tensor factories asked for a CUDA device make CPU tensors."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = CpuCuda()
        for name in FACTORIES:
            setattr(self, name, _on_cpu(getattr(torch, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


class GlooDist(types.ModuleType):
    """``torch.distributed`` as the bridge's file sees it: every group it makes is a Gloo group."""

    def __init__(self) -> None:
        super().__init__("torch.distributed")

        def gloo(make: Callable) -> Callable:
            return lambda *args, **kwargs: make(*args, **{**kwargs, "backend": "gloo"})

        self.new_group = gloo(dist.new_group)
        self.new_subgroups_by_enumeration = gloo(dist.new_subgroups_by_enumeration)

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)


def _tracker_add(self: Any, name: str, seed: int) -> None:
    """``CudaRNGStatesTracker.add`` on the CPU: a CPU generator state seeded with ``seed``."""
    if seed in self.seeds_:
        raise Exception(f"seed {seed} already exists")
    if name in self.states_:
        raise Exception(f"rng state {name} already exists")
    self._is_initialized = True
    self.seeds_.add(seed)
    self.states_[name] = torch.Generator().manual_seed(seed).get_state()


@contextlib.contextmanager
def _tracker_fork(self: Any, name: str = "model-parallel-rng") -> Iterator[None]:
    """``CudaRNGStatesTracker.fork`` on the CPU: the global CPU generator runs on the named state inside."""
    if name not in self.states_:
        raise Exception(f"rng state {name} is not added")
    outside = torch.get_rng_state()
    torch.set_rng_state(self.states_[name])
    try:
        yield
    finally:
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(outside)


def clip_grad_by_total_norm_fp32(parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False) -> None:
    """``clip_grads.clip_grad_by_total_norm_fp32`` on the CPU: each gradient scaled by ``max_norm / (total_norm +
    1e-6)`` where that is below 1."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    coefficient = max_norm / (total_norm + 1.0e-6)
    if coefficient >= 1.0:
        return
    for param in parameters:
        grad = getattr(param, "decoupled_grad", None) if use_decoupled_grad else param.grad
        if grad is not None:
            grad.detach().mul_(coefficient)


LOCAL_ATTENTION: dict[str, Callable] = {}
"""megatron-core's own ``DotProductAttention.forward``, kept while :func:`thd_attention` stands in for it."""


def thd_attention(self: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, attn_mask_type: Any = None,
                  attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
    """``DotProductAttention.forward`` taking packed sequences as TransformerEngine's THD attention does: ``query``,
    ``key``, ``value`` ``[t, heads, head width]`` (megatron-core's attention squeezes the batch of one), sequence
    ``i`` at rows ``cu_seqlens_q_padded[i]`` on (``cu_seqlens_q`` without padding), its ``cu_seqlens_q[i + 1] -
    cu_seqlens_q[i]`` real tokens attending causally to the real tokens of the same sequence alone; the padding
    rows after them (to the pack multiple) get zeros. Returns ``[t, heads x head width]``. Without
    ``packed_seq_params``: the local attention, unchanged."""
    if packed_seq_params is None:
        return LOCAL_ATTENTION["forward"](self, query, key, value, attention_mask, attn_mask_type=attn_mask_type, attention_bias=attention_bias)
    if packed_seq_params.qkv_format != "thd" or attention_bias is not None or self.config.softmax_type != "vanilla" or self.config.window_size:
        raise NotImplementedError("the THD stand-in covers vanilla softmax without attention bias or sliding windows")
    real = packed_seq_params.cu_seqlens_q.tolist()
    if packed_seq_params.cu_seqlens_kv.tolist() != real:
        raise NotImplementedError("the THD stand-in covers self-attention (cu_seqlens_kv equal to cu_seqlens_q)")
    padded = real if packed_seq_params.cu_seqlens_q_padded is None else packed_seq_params.cu_seqlens_q_padded.tolist()
    repeat = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
    key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    # The local attention divides its scale by the layer number with query-key layer scaling and its softmax
    # multiplies it back: the product is the scale of the scores.
    scale = self.softmax_scale * (self.layer_number if self.config.apply_query_key_layer_scaling else 1)
    pieces, end = [], 0
    for start, length in zip(padded[:-1], (after - before for before, after in zip(real, real[1:]))):
        pieces.append(query.new_zeros(start - end, *query.shape[1:]))  # the previous sequence's padding
        rows = slice(start, start + length)
        q, k, v = (tensor[rows].transpose(0, 1) for tensor in (query, key, value))  # [heads, length, width]
        scores = torch.matmul(q, k.transpose(1, 2)).float() * scale
        scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool, device=scores.device).triu(1), float("-inf"))
        probs = dropped(self, torch.softmax(scores, dim=-1).to(q.dtype))
        pieces.append(torch.matmul(probs, v).transpose(0, 1))
        end = start + length
    pieces.append(query.new_zeros(query.size(0) - end, *query.shape[1:]))
    return torch.cat(pieces).reshape(query.size(0), -1)


def dropped(attention: Any, probs: torch.Tensor) -> torch.Tensor:
    """The local attention's dropout of its probabilities, on the model-parallel random state as it draws it."""
    from megatron.core import tensor_parallel

    if attention.config.sequence_parallel:
        return attention.attention_dropout(probs)
    with tensor_parallel.get_cuda_rng_tracker().fork():
        return attention.attention_dropout(probs)


# ------------------------------------------------------------------------------------------- applying


@contextlib.contextmanager
def _swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


@contextlib.contextmanager
def megatron_on_cpu() -> Iterator[None]:
    """Every stand-in of ``PATCHES`` in place while inside; megatron-core as it was after."""
    from megatron.core.models.mimo import optimizer as mimo_optimizer
    from megatron.core.optimizer import clip_grads, optimizer
    from megatron.core.pipeline_parallel import bridge_communicator
    from megatron.core.tensor_parallel import random
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    cpu_torch = CpuTorch()
    with contextlib.ExitStack() as stack:
        for name in TORCH_OF:
            stack.enter_context(_swapped(importlib.import_module(name), "torch", cpu_torch))
        stack.enter_context(_swapped(torch.cuda, "current_device", lambda: "cpu"))
        stack.enter_context(_swapped(bridge_communicator, "dist", GlooDist()))
        stack.enter_context(_swapped(random.CudaRNGStatesTracker, "add", _tracker_add))
        stack.enter_context(_swapped(random.CudaRNGStatesTracker, "fork", _tracker_fork))
        for owner in (clip_grads, optimizer, mimo_optimizer):
            stack.enter_context(_swapped(owner, "clip_grad_by_total_norm_fp32", clip_grad_by_total_norm_fp32))
        LOCAL_ATTENTION.setdefault("forward", DotProductAttention.forward)
        stack.enter_context(_swapped(DotProductAttention, "forward", thd_attention))
        yield


def changed_patches() -> list[str]:
    """The ``PATCHES`` whose megatron-core function is missing or differs from the release they were written for."""
    changed = []
    for patch in PATCHES:
        try:
            sha = source_sha(patch.target())
        except (ImportError, AttributeError) as error:
            changed.append(f"{patch.file}: {patch.function} is gone ({error})")
            continue
        if sha != patch.source_sha:
            changed.append(f"{patch.file}: {patch.function} changed (source sha {sha}, written against {patch.source_sha})")
    return changed
