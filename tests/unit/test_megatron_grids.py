"""The pipeline's layout from megatron-core's ``module_to_grid_map``: real ``HyperCommGrid`` objects (built with
``WORLD_SIZE`` set, no process group), their rank enumerations as the reference, and every map the pipeline
cannot serve refused in one line naming the module."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.config import PipelineConfig
from mimo_pipes.errors import ConfigError
from mimo_pipes.megatron.grids import GridMapError, grid_layout
from mimo_pipes.parallel.pairing import FAN_IN_LIMIT


@contextlib.contextmanager
def world(size: int) -> Iterator[None]:
    previous = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(size)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["WORLD_SIZE"]
        else:
            os.environ["WORLD_SIZE"] = previous


def grid(offset: int, dims: tuple[str, ...] = ("tp", "cp", "pp", "dp"), **sizes: int):
    from megatron.core.hyper_comm_grid import HyperCommGrid

    return HyperCommGrid([sizes.get(dim, 1) for dim in dims], list(dims), rank_offset=offset)


def grid_map(world_size: int, **modules: dict) -> dict:
    with world(world_size):
        return {name: grid(**spec) for name, spec in modules.items()}


layouts = st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 2), st.integers(1, 2), st.booleans(),
                    st.sampled_from([("tp", "cp", "pp", "dp"), ("tp", "cp", "dp", "pp"), ("dp", "tp", "pp", "cp"), ("pp", "dp", "tp", "cp")]))


@settings(max_examples=40, deadline=None)
@given(layouts)
def test_every_rank_is_placed_as_the_grids_enumerate_it(layout) -> None:
    """Images dp e (tp 1 or 2) then language of tp, pp and dp k*e, the language grid's dims in any order: each
    module's DP groups, and every rank's DP, TP and PP coordinates, are the grids' own enumerations; the specs
    written out give the same topology."""
    encoder_dp, k, tp, pp, language_first, dims = layout
    encoder_tp = 2 if language_first else 1
    encoder_size, language_size = encoder_tp * encoder_dp, tp * pp * encoder_dp * k
    offsets = (language_size, 0) if language_first else (0, encoder_size)
    grids = grid_map(encoder_size + language_size,
                     images={"offset": offsets[0], "tp": encoder_tp, "dp": encoder_dp},
                     language={"offset": offsets[1], "tp": tp, "pp": pp, "dp": encoder_dp * k, "dims": dims})
    layout_ = grid_layout(grids, micro_batch_size=4 * encoder_dp * k)
    topology = layout_.topology
    assert not layout_.colocated and topology.world_size == encoder_size + language_size
    for name, module_grid in grids.items():
        module = topology.module(name)
        assert topology.dp_groups(module) == module_grid.get_rank_enum(["dp"])
        for dim, attribute in (("dp", "dp_rank"), ("tp", "tp_rank"), ("pp", "pp_rank")):
            for group in module_grid.get_rank_enum([dim]):
                assert [getattr(topology.position(rank), attribute) for rank in group] == list(range(len(group)))
                assert {layout_.module_of(rank) for rank in group} == {name}
    config = PipelineConfig(components=layout_.components, micro_batch_size=4 * encoder_dp * k)
    assert config.validate(topology.world_size) == topology


def test_grids_in_megatrons_own_dimension_orders_are_read_alike() -> None:
    """dim_names in megatron-core's default order (tp, cp, dp, pp) with pp 1, or without the size-1 dimensions,
    are the pipeline's default placement; with pp and dp both > 1 that order is written into the spec."""
    grids = grid_map(6, images={"offset": 0, "dims": ("tp", "cp", "dp", "pp"), "dp": 2},
                     language={"offset": 2, "dims": ("tp", "dp"), "tp": 2, "dp": 2})
    topology = grid_layout(grids).topology
    assert [m.spec for m in topology.modules] == ["images=tp=1,cp=1,pp=1,dp=2,etp=1,rank_offset=0",
                                                  "language=tp=2,cp=1,pp=1,dp=2,etp=1,rank_offset=2"]
    grids = grid_map(5, images={"offset": 0}, language={"offset": 1, "dims": ("tp", "cp", "dp", "pp"), "pp": 2, "dp": 2})
    language = grid_layout(grids).topology.module("language")
    assert language.spec == "language=tp=1,cp=1,pp=2,dp=2,etp=1,rank_offset=1,order=dp-pp-tp-cp"
    assert [grid_layout(grids).topology.position(rank).pp_rank for rank in range(1, 5)] == [0, 0, 1, 1]


def test_colocated_grids_are_one_module_holding_every_field() -> None:
    grids = grid_map(4, images={"offset": 0, "dp": 4}, language={"offset": 0, "tp": 2, "dp": 2})
    with pytest.raises(GridMapError, match="^module_to_grid_map: images dp=4 on the language model's ranks"):
        grid_layout(grids)
    grids = grid_map(4, images={"offset": 0, "tp": 2, "dp": 2}, language={"offset": 0, "tp": 2, "dp": 2})
    layout = grid_layout(grids)
    assert layout.colocated and layout.components == ("language=tp=2,cp=1,pp=1,dp=2,etp=1,rank_offset=0",)
    assert [layout.module_of(rank) for rank in range(4)] == [None] * 4


REFUSED = {
    "no language grid": ({"images": {"offset": 0, "dp": 1}, "llm": {"offset": 1, "dp": 1}}, 2, "no 'language' grid"),
    "fan-in": ({"images": {"offset": 0, "dp": 2}, "language": {"offset": 2, "dp": 1}}, 3, f"images dp=2 exceeds language dp=1: {FAN_IN_LIMIT}"),
    "fan-out not a multiple": ({"images": {"offset": 0, "dp": 2}, "language": {"offset": 2, "dp": 3}}, 5, "language dp=3 is not a multiple of images dp=2"),
    "overlap": ({"images": {"offset": 0, "dp": 2}, "language": {"offset": 1, "dp": 2}}, 3, "language ranks 1-2 overlap images ranks 0-1"),
    "gap": ({"images": {"offset": 0, "dp": 1}, "language": {"offset": 2, "dp": 2}}, 4, "rank 1 belongs to no module"),
    "encoder pp": ({"images": {"offset": 0, "pp": 2}, "language": {"offset": 2, "dp": 2}}, 4, "images: encoder pipeline parallelism"),
    "context parallel": ({"images": {"offset": 0}, "language": {"offset": 1, "cp": 2}}, 3, "language cp=2: megatron-core's BridgeCommunicator"),
    "no dp": ({"images": {"offset": 0, "dims": ("tp",)}, "language": {"offset": 1}}, 2, "images: the grid has no 'dp' dimension"),
    "unknown dimension": ({"images": {"offset": 0, "dims": ("tp", "xp", "dp")}, "language": {"offset": 1}}, 2, "images: dimension 'xp'"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_map_the_pipeline_cannot_serve_is_refused_in_one_line_naming_the_module(case: str) -> None:
    modules, world_size, message = REFUSED[case]
    grids = grid_map(world_size, **modules)
    with pytest.raises(GridMapError) as info:
        grid_layout(grids)
    text = str(info.value)
    assert text.startswith("module_to_grid_map: ") and message in text and "\n" not in text
    assert isinstance(info.value, ConfigError) and info.value.setting == "module_to_grid_map"


def test_a_micro_batch_the_dp_sizes_do_not_divide_is_refused() -> None:
    grids = grid_map(6, images={"offset": 0, "dp": 2}, language={"offset": 2, "dp": 4})
    assert grid_layout(grids, micro_batch_size=8).topology.grid_size == 4
    for bad in (6, 10, np.int64(6)):
        with pytest.raises(GridMapError, match=r"not a multiple of 4, the lcm of the DP sizes \(images dp=2, language dp=4\)"):
            grid_layout(grids, micro_batch_size=bad)
    for same in (np.int64(8), np.int32(8), torch.tensor(8)):
        assert grid_layout(grids, micro_batch_size=same).topology.grid_size == 4
    # Not a size at all: the reason is the kind or the range, not the DP sizes.
    for bad, reason in ((0, "got 0"), (8.0, "got 8.0 (a float)"), (True, "got True (a bool)"), ("8", "got '8' (a str)")):
        with pytest.raises(ConfigError, match=f"^micro_batch_size: must be an integer >= 1, {re.escape(reason)}$"):
            grid_layout(grids, micro_batch_size=bad)


def test_what_is_not_a_grid_is_named() -> None:
    with pytest.raises(GridMapError, match="images: dict is not a HyperCommGrid"):
        grid_layout({"images": {}, "language": grid_map(1, language={"offset": 0})["language"]})
    with pytest.raises(GridMapError, match="needs one HyperCommGrid per module"):
        grid_layout({})


def test_fan_in_is_refused_by_the_same_words_on_the_component_path() -> None:
    config = PipelineConfig(components=("language=dp=1", "images=dp=2,rank_offset=1"), micro_batch_size=2)
    with pytest.raises(ConfigError, match=re.escape(FAN_IN_LIMIT)):
        config.validate(3)


def test_rank_layout_without_a_process_group_says_so_in_one_line() -> None:
    """grid_layout reads grids alone; rank_layout makes groups, so it needs torch.distributed (not torch's raw ValueError)."""
    from mimo_pipes.megatron import rank_layout

    assert not torch.distributed.is_initialized()
    grids = grid_map(4, images={"offset": 0, "dp": 2}, language={"offset": 2, "dp": 2})
    with pytest.raises(RuntimeError, match=r"^rank_layout: torch.distributed is not initialised: .*init_process_group") as raised:
        rank_layout(grids, micro_batch_size=4)
    assert "\n" not in str(raised.value)
