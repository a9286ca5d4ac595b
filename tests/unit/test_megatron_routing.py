"""The bridge's routing rule (mimo_pipes.megatron.routing) against megatron-core's own functions, run on CPU
with stand-ins for the objects they hang on: its bridge's cut (every version) and, where the installed
megatron-core has them (0.19), the per-sample sizes its ``MimoModel`` attaches on an encoder rank."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.megatron.routing import attached_split_sizes, peer_row_counts, peer_sample_ranges

TOKEN = 7


def megatron_cut(output: torch.Tensor, peers: int) -> list[int]:
    """Rows per peer as megatron-core's BridgeCommunicator cuts a flat encoder output (2-D, batch folded in dim 0)."""
    from megatron.core.pipeline_parallel.bridge_communicator import BridgeCommunicator

    bridge = SimpleNamespace(tensor_ndim=2, dim_mapping={"s": 1, "b": 0, "h": 2})
    if "_batch_dim" in vars(BridgeCommunicator):
        bridge._batch_dim = 0
    return [int(piece.shape[0]) for piece in BridgeCommunicator._split_tensor_at_batch_dim(bridge, output, peers)]


def megatron_attach() -> object | None:
    """megatron-core's MimoModel._attach_modality_split_sizes (None where the version has none: 0.16)."""
    from megatron.core.models.mimo.model.base import MimoModel

    return getattr(MimoModel, "_attach_modality_split_sizes", None)


def attach_like_megatron(output: torch.Tensor, input_ids: torch.Tensor) -> None:
    """megatron-core's own attach on ``output``, on a stand-in model (colocated role: no fan-in assertion)."""
    model = SimpleNamespace(special_token_ids={"images": TOKEN}, role=SimpleNamespace(mode=None))
    megatron_attach()(model, output, input_ids, "images")


def input_ids(counts: list[int], length: int) -> torch.Tensor:
    rows = torch.zeros((len(counts), length), dtype=torch.long)
    for row, count in enumerate(counts):
        rows[row, 1 : 1 + count] = TOKEN
    return rows


counts_and_peers = st.integers(1, 4).flatmap(
    lambda peers: st.tuples(st.lists(st.integers(0, 9), min_size=peers, max_size=peers * 3).map(lambda c: c[: len(c) - len(c) % peers]), st.just(peers))
)


@given(counts_and_peers)
def test_each_peer_gets_the_rows_of_its_own_samples(case) -> None:
    """With the pipeline's pairing (peer j holds the j-th group of consecutive samples) the rule gives every peer
    exactly its samples' placeholder rows, whatever the counts (equal counts: the equal cut is the same cut)."""
    counts, peers = case
    groups = peer_sample_ranges(len(counts), peers)
    assert peer_row_counts(counts, sum(counts), peers) == [sum(counts[i] for i in group) for group in groups]


def test_without_sizes_the_cut_is_by_equal_rows_and_misroutes_uneven_images() -> None:
    assert attached_split_sizes([4, 4], 8) is None and attached_split_sizes([6], 6) is None
    assert attached_split_sizes([1, 5], 7) is None  # an output that is not one row per placeholder
    assert peer_row_counts([1, 5], 7, 2) == [4, 3]
    with pytest.raises(ValueError, match="3 per-sample sizes cannot be cut into 2 pieces"):
        peer_row_counts([1, 2, 3], 6, 2)


@settings(max_examples=60, deadline=None)
@given(counts_and_peers)
def test_the_rule_is_megatron_cores_own(case) -> None:
    """megatron-core's own attach and cut, on CPU, give each peer the rows the rule says."""
    counts, peers = case
    output = torch.arange(sum(counts), dtype=torch.float32)[:, None].repeat(1, 3)
    if megatron_attach() is None:  # 0.16 cuts by equal rows alone: the rule's cut when no sizes are attached
        assert megatron_cut(output, peers) == peer_row_counts([], sum(counts), peers)
        return
    attach_like_megatron(output, input_ids(counts, 12))
    assert getattr(output, "_mimo_bridge_split_sizes", None) == attached_split_sizes(counts, sum(counts))
    assert megatron_cut(output, peers) == peer_row_counts(counts, sum(counts), peers)


def test_a_batch_first_output_is_cut_into_consecutive_samples() -> None:
    """A ``[B, S, H]`` tensor (megatron-core's default mapping, batch on dim 0) reaches peer j as samples group j."""
    from megatron.core.pipeline_parallel.bridge_communicator import BridgeCommunicator

    bridge = SimpleNamespace(tensor_ndim=3, dim_mapping={"s": 1, "b": 0, "h": 2})
    if "_batch_dim" in vars(BridgeCommunicator):
        bridge._batch_dim = 0
    samples = torch.arange(8, dtype=torch.float32)[:, None, None].repeat(1, 2, 3)
    pieces = BridgeCommunicator._split_tensor_at_batch_dim(bridge, samples, 4)
    assert [piece[:, 0, 0].tolist() for piece in pieces] == [[float(i) for i in group] for group in peer_sample_ranges(8, 4)]


def test_an_encoder_ranks_mimo_batch_holds_what_megatron_core_splits_by() -> None:
    """An images rank's micro-batch of the built-in processor (packing on, as the language ranks pack theirs)
    reaches MimoModel.forward with one input_ids row per sample whose placeholders are each sample's image
    tokens, beside the encoder inputs; the token fields the language model trains on stay home."""
    from mimo_pipes.config import PipelineConfig
    from mimo_pipes.exchange import RankLayout
    from mimo_pipes.megatron import MimoBatchSettings, mimo_batch
    from mimo_pipes_recipes import vlm_sft

    config = PipelineConfig(components=("language=dp=1", "images=dp=1,rank_offset=1"), micro_batch_size=4, seq_length=2048,
                            embedded_samples=16, num_workers=1, pack_sequences_in_batch=True)
    vlm_sft.prepare(config, log=lambda line: None)
    processor = vlm_sft.open_processor(config)
    settings = MimoBatchSettings.for_processor(processor, mrope=False)
    loader = vlm_sft.build(config, RankLayout(0, 1, 1, module="images"))
    try:
        batch = next(iter(loader))
    finally:
        loader.close()
    kwargs = mimo_batch(batch, settings)
    counts = (kwargs["input_ids"] == processor.image_token_id).sum(dim=1).tolist()
    assert kwargs["input_ids"].shape[0] == len(batch["sample_ids"]) == 4 and kwargs["packing_kwargs"] is None
    assert counts == [int(tokens) for tokens in batch["image_tokens"]]
    assert kwargs["modality_inputs"] is not None and all(kwargs[key] is None for key in ("labels", "loss_mask", "attention_mask"))
    assert peer_row_counts(counts, sum(counts), 2) == [sum(counts[:2]), sum(counts[2:])]
