"""Grid arithmetic, slot ownership, fan-out and rank placement (pure; megatron-core's grid as reference)."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.config.flags import flag_names
from mimo_pipes.errors import ConfigError
from mimo_pipes.parallel.topology import (
    GRID_DIMS,
    ModuleSpec,
    build_topology,
    canonical_slot_count,
    fanout_targets,
    owned_positions,
    owned_slots,
    parse_component,
)

dp_sizes = st.lists(st.integers(1, 12), min_size=1, max_size=4)


@given(dp_sizes)
def test_canonical_grid_is_lcm_and_every_module_divides_it(sizes):
    slots = canonical_slot_count(sizes)
    assert slots == math.lcm(*sizes)
    for size in sizes:
        assert slots % size == 0


@given(dp_sizes, st.integers(1, 4))
def test_every_slot_and_position_owned_exactly_once_per_module(sizes, per_slot):
    slots = canonical_slot_count(sizes)
    batch = slots * per_slot
    for size in sizes:
        owners = [rank for rank in range(size) for _ in owned_slots(rank, size, slots)]
        assert owners == sorted(owners) and len(owners) == slots
        positions = [p for rank in range(size) for p in owned_positions(rank, size, batch)]
        assert positions == list(range(batch))


@given(st.integers(1, 8), st.integers(1, 6), st.integers(1, 4))
def test_fanout_pairs_encoder_slots_with_language_slots(encoder_dp, k, per_slot):
    language_dp = encoder_dp * k
    slots = canonical_slot_count([encoder_dp, language_dp])
    for encoder_rank in range(encoder_dp):
        fed = [s for lang in fanout_targets(encoder_rank, encoder_dp, language_dp) for s in owned_slots(lang, language_dp, slots)]
        assert fed == list(owned_slots(encoder_rank, encoder_dp, slots))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2), st.integers(1, 3), st.integers(1, 4), st.integers(0, 5))
def test_rank_position_matches_megatron_hypercommgrid(tp, cp, pp, dp, offset):
    from megatron.core.hyper_comm_grid import HyperCommGrid

    module = ModuleSpec("language", tp=tp, cp=cp, pp=pp, dp=dp, rank_offset=offset)
    filler = [ModuleSpec("images", rank_offset=0, dp=offset)] if offset else []
    topology = build_topology(filler + [module])
    os.environ["WORLD_SIZE"] = str(topology.world_size)
    try:
        grid = HyperCommGrid(module.grid_shape, list(GRID_DIMS), rank_offset=offset)
        for dims, attribute in (("dp", "dp_rank"), ("tp", "tp_rank"), ("pp", "pp_rank")):
            for group in grid.get_rank_enum([dims]):
                for index, rank in enumerate(group):
                    assert getattr(topology.position(rank), attribute) == index
        assert sorted(map(sorted, grid.get_rank_enum(["dp"]))) == sorted(map(sorted, topology.dp_groups(module)))
        assert grid.get_rank_enum(["dp"]) == topology.dp_groups(module)
    finally:
        del os.environ["WORLD_SIZE"]


def test_parse_component_defaults_and_errors():
    spec = parse_component("images=tp=2,dp=2,rank_offset=2")
    assert (spec.name, spec.tp, spec.cp, spec.pp, spec.dp, spec.etp, spec.rank_offset) == ("images", 2, 1, 1, 2, 1, 2)
    for bad in ("images", "=dp=2", "images=dp=two", "images=dp=0", "images=xp=2", "images=dp=2,dp=3"):
        with pytest.raises(ConfigError) as info:  # Python: the field
            parse_component(bad)
        assert info.value.setting == "components"
        with pytest.raises(ConfigError) as info, flag_names():  # a command: its flag
            parse_component(bad)
        assert info.value.setting == "--component"


def test_tiling_names_the_missing_and_the_doubled_rank():
    with pytest.raises(ConfigError, match="rank 2 belongs to no module"):
        build_topology(["language=dp=2", "images=dp=2,rank_offset=3"])
    with pytest.raises(ConfigError, match="rank 1 is claimed by more than one module"):
        build_topology(["language=dp=2", "images=dp=2,rank_offset=1"])
    with pytest.raises(ConfigError, match="no module named 'language'"):
        build_topology(["vision=dp=2"])
    with pytest.raises(ConfigError, match="rank 4 belongs to no module"):
        build_topology(["language=dp=2", "images=dp=2,rank_offset=2"], world_size=5)
    topology = build_topology(["language=tp=2,dp=2", "images=dp=2,rank_offset=4"])
    assert topology.world_size == 6 and topology.grid_size == 2


def test_a_module_placed_in_another_order_round_trips_and_bad_orders_are_refused():
    spec = parse_component("language=pp=2,dp=2,rank_offset=1,order=tp-cp-dp-pp")
    assert parse_component(spec.spec) == spec and spec.spec.endswith(",order=tp-cp-dp-pp")
    topology = build_topology(["images=dp=1", spec])
    assert [(topology.position(r).dp_rank, topology.position(r).pp_rank) for r in range(1, 5)] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert topology.dp_groups(spec) == [[1, 2], [3, 4]]
    assert parse_component("language=dp=2,order=tp-cp-pp-dp").spec == "language=tp=1,cp=1,pp=1,dp=2,etp=1,rank_offset=0"
    for bad in ("language=dp=2,order=tp-dp", "language=dp=2,order=tp-cp-pp-dp-dp", "language=dp=2,order=tp-cp-ep-dp"):
        with pytest.raises(ConfigError, match="must list tp, cp, pp and dp once each"):
            parse_component(bad)
