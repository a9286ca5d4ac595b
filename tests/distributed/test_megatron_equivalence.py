"""The non-colocated recipe (``megatron_mimo_grids``: the vision module and the language model on their own ranks,
megatron-core's bridge and 1F1B schedule) trains exactly as the colocated one (``megatron_mimo_train``: one rank,
megatron-core's schedule without pipelining): same settings, seed and data, per-iteration losses within 1e-5
relative and per-module gradient norms equal, reordering off and on, windows across micro-batches. On CPU ranks
over Gloo (``--device cpu``), megatron-core 0.19 or later (Python 3.12: the 3.12 tier, ``scripts/test312.sh``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from dist_pool import GLOO_WORLD, DistPool, shared_pool
from scenarios_megatron_equivalence import colocated_run, grids_run

from mimo_pipes_recipes import megatron_mimo_grids as grids

pytestmark = pytest.mark.skipif(grids.megatron_core_problem() is not None, reason="needs megatron-core 0.19 or later (Python 3.12)")

RELATIVE = 1e-5
LAYOUTS = {"images dp 1 + language dp 2": (1, 2), "images dp 2 + language dp 4": (2, 4)}
CASES = [("images dp 1 + language dp 2", "off"), ("images dp 1 + language dp 2", "on"), ("images dp 2 + language dp 4", "on")]


@pytest.fixture(scope="module")
def pools() -> dict[int, DistPool]:
    """Warm pools of exactly the ranks each recipe's world has (megatron-core's optimizers gather over the whole
    world): one rank for the colocated recipe, each layout's for the non-colocated one."""
    sizes = {1, *(sum(layout) for layout in LAYOUTS.values())}
    started = {size: DistPool(size) for size in sizes if size != GLOO_WORLD}
    yield {**started, **({GLOO_WORLD: shared_pool()} if GLOO_WORLD in sizes else {})}  # the shared pool when it is the size
    for pool in started.values():
        pool.close()


def train_both(pools: dict[int, DistPool], images_dp: int, language_dp: int, **settings) -> dict:
    """Both recipes at once, each on its own pool (the colocated rank beside the non-colocated ranks, which mostly
    wait on each other)."""
    with ThreadPoolExecutor(2) as runner:
        alone = runner.submit(pools[1].run, colocated_run, timeout=600, **settings)
        split = runner.submit(pools[images_dp + language_dp].run, grids_run, images_dp=images_dp, language_dp=language_dp, timeout=600, **settings)
        outcome = alone.result()[0]
        return {"colocated": outcome["training"], "samples": outcome["samples"], "grids": split.result()[0]}


def assert_same_training(outcome: dict) -> None:
    colocated, noncolocated = outcome["colocated"], outcome["grids"]
    assert len(colocated) == len(noncolocated) > 0
    for number, ((loss, norms), (grid_loss, grid_norms)) in enumerate(zip(colocated, noncolocated), start=1):
        assert grid_loss == pytest.approx(loss, rel=RELATIVE), f"iteration {number}: loss {grid_loss} != {loss}"
        assert set(grid_norms) == set(norms) == {"images", "language"}
        for module, norm in norms.items():
            assert norm > 0, f"iteration {number}: {module} has no gradient"
            assert grid_norms[module] == pytest.approx(norm, rel=RELATIVE), f"iteration {number}: {module} gradient norm {grid_norms[module]} != {norm}"
    assert colocated[0][0] != colocated[-1][0]  # it trains: the loss moves


@pytest.mark.parametrize(("layout", "reorder"), CASES)
def test_the_noncolocated_recipe_trains_as_the_colocated_one(pools, layout, reorder):
    images_dp, language_dp = LAYOUTS[layout]
    assert_same_training(train_both(pools, images_dp, language_dp, reorder=reorder, iterations=2))
