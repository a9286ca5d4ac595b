"""The test helper that runs megatron-core on CPU ranks (``tests/helpers/megatron_on_cpu.py``) stands in for exactly
the functions it names: when megatron-core changes any of them, this fails, so that the stand-in is looked at again.
Its stand-ins work (CPU tensors, Gloo groups, CPU random states, packed sequences through the local attention) and
are all put back on leaving."""

from __future__ import annotations

import importlib
import types
from collections.abc import Iterator

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
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    before = (utils.torch, torch.cuda.current_device, random.CudaRNGStatesTracker.fork, clip_grads.clip_grad_by_total_norm_fp32,
              DotProductAttention.forward)
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
    assert (utils.torch, torch.cuda.current_device, random.CudaRNGStatesTracker.fork, clip_grads.clip_grad_by_total_norm_fp32,
            DotProductAttention.forward) == before


class _OneRank:
    """A tensor-parallel group of one rank: all the local attention asks of its group."""

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


@pytest.fixture
def attention() -> Iterator[tuple]:
    """megatron-core's local attention (4 query heads in 2 groups of width 16, no dropout), built and run inside
    :func:`megatron_on_cpu`, and its own ``forward`` as megatron-core has it."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    local = DotProductAttention.forward
    config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2, attention_dropout=0.0, hidden_dropout=0.0)
    with megatron_on_cpu():
        parallel_state._set_global_memory_buffer()  # what initialize_model_parallel makes: the local attention's scores buffer
        tensor_parallel.model_parallel_cuda_manual_seed(1, tp_rank=0, ep_rank=0, etp_rank=0)  # the state its dropout forks
        try:
            yield DotProductAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self",
                                      pg_collection=types.SimpleNamespace(tp=_OneRank())), local
        finally:
            parallel_state.destroy_global_memory_buffer()
            tensor_parallel.get_cuda_rng_tracker().reset()


def _qkv(tokens: int, seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(tokens, heads, 16, generator=generator, requires_grad=True) for heads in (4, 2, 2)]


def test_packed_sequences_attend_each_as_if_alone(attention) -> None:
    """Three sequences of 5, 1 and 7 tokens packed at a multiple of 8 (TransformerEngine's THD input, as the library
    packs it): each one's output and gradients are the unpatched local attention's over that sequence alone (BSHD,
    causal), and its padding rows are zero and take no gradient."""
    from megatron.core.packed_seq_params import PackedSeqParams

    module, local = attention
    real, padded = [0, 5, 6, 13], [0, 8, 16, 24]
    packed = _qkv(24, seed=0)
    cuts = {key: torch.tensor(value, dtype=torch.int32) for key, value in (("real", real), ("padded", padded))}
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cuts["real"], cu_seqlens_kv=cuts["real"], cu_seqlens_q_padded=cuts["padded"],
                             cu_seqlens_kv_padded=cuts["padded"], max_seqlen_q=8, max_seqlen_kv=8)
    out = module(*packed, None, packed_seq_params=params)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weights).sum().backward()
    assert out.shape == (24, 64)
    for start, length in zip(padded, (after - before for before, after in zip(real, real[1:]))):
        rows = slice(start, start + length)
        alone = [tensor.detach()[rows].unsqueeze(1).requires_grad_() for tensor in packed]  # [s, b = 1, heads, width]
        expected = local(module, *alone, None)
        (expected * weights[rows].unsqueeze(1)).sum().backward()
        torch.testing.assert_close(out[rows], expected.squeeze(1), rtol=1e-6, atol=1e-6)
        for whole, own in zip(packed, alone):
            torch.testing.assert_close(whole.grad[rows], own.grad.squeeze(1), rtol=1e-6, atol=1e-6)
        pad = slice(start + length, start + 8)
        assert not out[pad].any() and all(not tensor.grad[pad].any() for tensor in packed)


def test_without_packed_sequences_it_is_the_local_attention(attention) -> None:
    module, local = attention
    query, key, value = (tensor.detach().unsqueeze(1) for tensor in _qkv(6, seed=2))
    torch.testing.assert_close(module(query, key, value, None), local(module, query, key, value, None), rtol=0, atol=0)
