"""With the library's sequence packing on (``--pack-sequences-in-batch --pack-pad-multiple 8``: each language
replica's micro-batch one THD row, every sequence padded to a multiple of 8), the non-colocated recipe
(images dp 1 + language dp 2, reordering on: windows of two micro-batches whose samples move between them) trains
exactly as the colocated one from the same settings, seed and data: per-iteration losses within 1e-5 relative and
per-module gradient norms equal. The colocated rank packs four sequences a row, each language replica two of
them, so the losses agree only if no sequence attends across its boundary and every sample reaches the replica
that holds its images.

megatron-core's local attention takes packed rows on the CPU through the tests' stand-in for TransformerEngine's
THD attention (:func:`megatron_on_cpu.thd_attention`). On CPU ranks over Gloo, megatron-core 0.19 or later (the
3.12 tier, ``scripts/test312.sh``), in the warm pools of exactly each recipe's world that
``test_megatron_equivalence.py`` trains in (:func:`dist_pool.exact_pool`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from dist_pool import exact_pool
from scenarios_megatron_packing import colocated_packed_run, grids_packed_run
from test_megatron_equivalence import LAYOUTS, assert_same_training, assert_samples_move_between_micro_batches

from mimo_pipes_recipes import megatron_mimo_grids as grids

pytestmark = pytest.mark.skipif(grids.megatron_core_problem() is not None, reason="needs megatron-core 0.19 or later (Python 3.12)")

PACKED = ["--pack-sequences-in-batch", "--pack-pad-multiple", "8", "--seq-length", "1536"]  # a row holds four sequences
MICROBATCHES = 2  # TINY's window of micro-batches (scenarios_megatron_equivalence)
SAMPLES = 4  # TINY's micro-batch size: the colocated rank packs all four, each language replica of two its two


def test_with_packing_on_the_noncolocated_recipe_trains_as_the_colocated_one():
    layout = LAYOUTS["images dp 1 + language dp 2"]
    settings = {"reorder": "on", "iterations": 2, "microbatches": MICROBATCHES, "extra": PACKED, "timeout": 900}
    with ThreadPoolExecutor(1) as runner:  # the colocated rank trains beside the non-colocated ones
        reference = runner.submit(exact_pool(1).run, colocated_packed_run, **settings)
        packed = exact_pool(3).run(grids_packed_run, **layout, **settings)[0]
        colocated = reference.result()[0]
    assert colocated["packed"] == [SAMPLES] * 2 * MICROBATCHES
    vision, *language = packed["packed"]  # images on rank 0, the language replicas after it
    assert vision == [0] * 2 * MICROBATCHES, "the vision rank gets one row per sample"
    assert language == [[SAMPLES // layout["language_dp"]] * 2 * MICROBATCHES] * layout["language_dp"]
    assert_same_training({"colocated": colocated["training"], "grids": packed["training"]})
    assert_samples_move_between_micro_batches(colocated["samples"], packed["samples"])

