"""The non-colocated recipe (``megatron_mimo_grids``: the vision module and the language model on their own ranks,
megatron-core's bridge and 1F1B schedule) trains exactly as the colocated one (``megatron_mimo_train``: one rank,
megatron-core's schedule without pipelining): same settings, seed and data, per-iteration losses within 1e-5
relative and per-module gradient norms equal, reordering off and on, windows across micro-batches. On CPU ranks
over Gloo (``--device cpu``), megatron-core 0.19 or later (Python 3.12: the 3.12 tier, ``scripts/test312.sh``).

And Megatron-Bridge 0.6.2's own MIMO loop (``pretrain_megatron_mimo``), fed by the pipeline through
``mimo_pipes_recipes.megatron_bridge``, trains exactly as the non-colocated recipe on the same model, seed and data,
and resumes from its own checkpoint (the pipeline's state inside it) with the same losses."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor

import pytest
from dist_pool import GLOO_WORLD, DistPool, shared_pool
from scenarios_megatron_equivalence import colocated_run, grids_run

from mimo_pipes.megatron.checkpoint import iteration_folder, pipeline_state_folder
from mimo_pipes_recipes import megatron_mimo_grids as grids

pytestmark = pytest.mark.skipif(grids.megatron_core_problem() is not None, reason="needs megatron-core 0.19 or later (Python 3.12)")

RELATIVE = 1e-5
LAYOUTS = {"images dp 1 + language dp 2": (1, 2), "images dp 2 + language dp 4": (2, 4)}
CASES = [("images dp 1 + language dp 2", "off"), ("images dp 1 + language dp 2", "on"), ("images dp 2 + language dp 4", "on")]


class Pools(dict):
    """Warm pools by world size, each started when a test first asks for it (a selection of tests starts only
    the pools it uses): the shared pool for its own size, else a pool of exactly that many ranks, not daemonic
    (megatron-core's checkpoint writer, which Bridge's save calls, starts a process of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[DistPool] = []

    def __missing__(self, size: int) -> DistPool:
        if size == GLOO_WORLD:
            pool = shared_pool()
        else:
            pool = DistPool(size, daemon=False)
            self.started.append(pool)
        self[size] = pool
        return pool


@pytest.fixture(scope="module")
def pools() -> Pools:
    """Pools of exactly the ranks each recipe's world has (megatron-core's optimizers gather over the whole world):
    one rank for the colocated recipe, each layout's for the non-colocated one."""
    started = Pools()
    yield started
    for pool in started.started:
        pool.close()


def train_both(pools: Pools, images_dp: int, language_dp: int, **settings) -> dict:
    """Both recipes at once, each on its own pool (the colocated rank beside the non-colocated ranks, which mostly
    wait on each other)."""
    alone_pool, split_pool = pools[1], pools[images_dp + language_dp]  # started here, one after the other
    with ThreadPoolExecutor(2) as runner:
        alone = runner.submit(alone_pool.run, colocated_run, timeout=600, **settings)
        split = runner.submit(split_pool.run, grids_run, images_dp=images_dp, language_dp=language_dp, timeout=600, **settings)
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


@pytest.mark.skipif(importlib.util.find_spec("megatron.bridge") is None, reason="Megatron-Bridge is not installed (scripts/setup312.sh installs it)")
def test_bridge_mimo_loop_fed_by_the_pipeline_trains_as_the_recipe(pools, tmp_path):
    """Images dp 1 + language dp 2, reordering on: Bridge's loss per iteration (its ``lm loss``, the per-token loss
    of the iteration) equals the recipe's, and Bridge's checkpoint of iteration 2 holds the pipeline's state.

    Resuming it is refused by Bridge 0.6.2 itself, on any device: megatron-core's ``torch_dist`` save keeps the
    common (unsharded) state of global rank 0 alone, here the vision module's optimizer parameter groups, so a
    language rank's ``MimoOptimizer.load_state_dict`` (Bridge's ``_load_checkpoint_from_path``) finds none of its
    own (its language ranks raise ``Could not find parameter group``; its vision rank waits for them). The test
    holds the cause, read from the checkpoint, so that it fails, and is turned into the resume check, once Bridge
    saves every module's state."""
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict
    from scenarios_megatron_bridge import bridge_run

    pool, save = pools[3], str(tmp_path / "checkpoints")
    recipe = [loss for loss, _norms in pool.run(grids_run, images_dp=1, language_dp=2, reorder="on", iterations=3, timeout=600)[0]]
    whole = pool.run(bridge_run, images_dp=1, language_dp=2, reorder="on", iterations=3, save=save, save_interval=2, timeout=600)[-1]
    assert len(whole) == len(recipe) == 3 and recipe[0] != recipe[-1]
    for number, (loss, recipe_loss) in enumerate(zip(whole, recipe), start=1):
        assert loss == pytest.approx(recipe_loss, rel=RELATIVE), f"iteration {number}: Bridge's loss {loss} != the recipe's {recipe_loss}"
    assert any(pipeline_state_folder(save, 2).iterdir())  # the loader state, inside Bridge's iteration folder
    optimizers = load_common_state_dict(str(iteration_folder(save, 2)))["optimizer"]
    assert optimizers["images"]["param_groups"] and optimizers["language"] == {}  # rank 0's module only
