"""The non-colocated recipe (``megatron_mimo_grids``: the vision module and the language model on their own ranks,
megatron-core's bridge and 1F1B schedule) trains exactly as the colocated one (``megatron_mimo_train``: one rank,
megatron-core's schedule without pipelining): same settings, seed and data, per-iteration losses within 1e-5
relative and per-module gradient norms equal, reordering off and on (a window of two micro-batches whose samples
move between them), and with the language model split over two tensor-parallel ranks or two pipeline stages (both
recipes from one set of full weights). On CPU ranks over Gloo (``--device cpu``), megatron-core 0.19 or later
(Python 3.12: the 3.12 tier, ``scripts/test312.sh``).

And Megatron-Bridge 0.6.2's own MIMO loop (``pretrain_megatron_mimo``), fed by the pipeline through
``mimo_pipes_recipes.megatron_bridge``, trains exactly as the non-colocated recipe on the same model, seed and data,
and resumes from its own checkpoint (the pipeline's state inside it) exactly."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from dist_pool import DistPool, exact_pool
from scenarios_megatron_equivalence import colocated_run, grids_run

from mimo_pipes.megatron.checkpoint import iteration_folder, pipeline_state_folder
from mimo_pipes_recipes import megatron_mimo_grids as grids

pytestmark = pytest.mark.skipif(grids.megatron_core_problem() is not None, reason="needs megatron-core 0.19 or later (Python 3.12)")

RELATIVE = 1e-5
LAYOUTS = {"images dp 1 + language dp 2": {"images_dp": 1, "language_dp": 2}, "images dp 2 + language dp 4": {"images_dp": 2, "language_dp": 4}}
MODEL_PARALLEL = {"language tp 2": {"language_tp": 2}, "language pp 2": {"language_pp": 2}}  # images dp 1, language dp 1: 3 ranks
TWO_LAYERS = ["--lm-layers", "2"]  # a layer for each pipeline stage


class Pools(dict):
    """Warm pools by world size, each taken when a test first asks for it (a selection of tests starts only the
    pools it uses): :func:`dist_pool.exact_pool`, started once for the whole run, so the packing equivalence
    (``test_megatron_packing_equivalence.py``) trains on the same warm ranks."""

    def __missing__(self, size: int) -> DistPool:
        pool = self[size] = exact_pool(size)
        return pool


@pytest.fixture(scope="module")
def pools() -> Pools:
    """Pools of exactly the ranks each recipe's world has (megatron-core's optimizers gather over the whole world):
    one rank for the colocated recipe, each layout's for the non-colocated one."""
    return Pools()


@pytest.fixture(scope="module")
def colocated(pools, tmp_path_factory) -> Iterator[dict[str, Future]]:
    """The colocated references, trained on the one-rank pool while the non-colocated runs train beside it: the
    one-layer model in reading order (its one rank keeps the reading order with reordering on too: nothing to
    balance), and the two-layer model, whose full weights as built both model-parallel layouts start from."""
    weights = str(tmp_path_factory.mktemp("weights") / "initial.pt")
    with ThreadPoolExecutor(1) as runner:  # one after the other, on the one rank
        yield {"one layer": runner.submit(pools[1].run, colocated_run, reorder="off", iterations=3, timeout=900),
               "two layers": runner.submit(pools[1].run, colocated_run, reorder="on", iterations=2, extra=TWO_LAYERS, save_weights=weights,
                                           timeout=900),
               "weights": weights}


def reference(colocated: dict[str, Future], name: str, iterations: int | None = None) -> dict:
    outcome = colocated[name].result()[0]
    return {"colocated": outcome["training"][:iterations], "samples": outcome["samples"][:iterations]}


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


def assert_samples_move_between_micro_batches(off: list[list[list[int]]], on: list[list[list[int]]]) -> None:
    """Per iteration (one window) the same samples, and some global micro-batch of the balanced window holds
    samples the reading order put in another: the window spans micro-batches."""
    assert off and on
    for plain, balanced in zip(off, on):
        assert sorted(sample for batch in plain for sample in batch) == sorted(sample for batch in balanced for sample in batch)
    assert any({*plain_batch} != {*balanced_batch} for plain, balanced in zip(off, on) for plain_batch, balanced_batch in zip(plain, balanced))


@pytest.fixture(scope="module")
def balanced(pools, tmp_path_factory) -> tuple[dict, Path]:
    """images dp 1 + language dp 2, reordering on, three iterations, each saved into Megatron's checkpoint folder
    (the model, the optimizer and the pipeline's state inside the iteration folder)."""
    folder = tmp_path_factory.mktemp("megatron-save")
    outcome = pools[3].run(grids_run, **LAYOUTS["images dp 1 + language dp 2"], reorder="on", iterations=3,
                           extra=["--save", str(folder), "--save-interval", "1"], timeout=900)[0]
    return outcome, folder


def test_the_noncolocated_recipe_trains_as_the_colocated_one_with_windows_across_micro_batches(pools, colocated, balanced):
    """images dp 1 + language dp 2, reordering off and on, each equal to the colocated run in reading order. Off, the
    global micro-batches are the colocated ones; on, the balanced window moves samples between its micro-batches
    and each window's loss (every sample of the window, per token) stays."""
    plain = pools[3].run(grids_run, **LAYOUTS["images dp 1 + language dp 2"], reorder="off", iterations=2, timeout=900)[0]
    reading_order = reference(colocated, "one layer")
    assert_same_training({**reading_order, "colocated": reading_order["colocated"][:2], "grids": plain["training"]})
    assert_same_training({**reading_order, "grids": balanced[0]["training"]})
    as_sets = [[sorted(batch) for batch in window] for window in reading_order["samples"][:2]]
    assert [[sorted(batch) for batch in window] for window in plain["samples"]] == as_sets
    assert_samples_move_between_micro_batches(reading_order["samples"], balanced[0]["samples"])


def test_a_resume_from_megatrons_checkpoint_folder_on_another_layout_continues_the_training(pools, colocated, balanced):
    """The run above resumed on images dp 2 + language dp 4 from its folder's latest committed iteration (the first:
    the later ones taken back, as if the job had died before their commits): iterations 2 and 3 equal to the
    uninterrupted run's (iteration 3's loss needs the optimizer's state of iteration 1 restored too)."""
    _, folder = balanced
    assert sorted(path.name for path in folder.iterdir()) == ["iter_0000001", "iter_0000002", "iter_0000003", "latest_checkpointed_iteration.txt"]
    (folder / "latest_checkpointed_iteration.txt").write_text("1")
    resumed = pools[6].run(grids_run, **LAYOUTS["images dp 2 + language dp 4"], reorder="on", iterations=3, extra=["--load", str(folder)],
                           timeout=900)[0]
    assert len(resumed["training"]) == 2
    assert_same_training({"colocated": reference(colocated, "one layer")["colocated"][1:], "grids": resumed["training"]})


@pytest.mark.parametrize("parallel", MODEL_PARALLEL)
def test_a_model_parallel_language_model_trains_as_the_colocated_one_from_the_same_weights(pools, colocated, parallel):
    training = reference(colocated, "two layers")["colocated"]  # its weights saved once it is built
    split = pools[3].run(grids_run, images_dp=1, language_dp=1, weights=colocated["weights"], reorder="on", iterations=2, extra=TWO_LAYERS,
                         **MODEL_PARALLEL[parallel], timeout=900)[0]
    assert_same_training({"colocated": training, "grids": split["training"]})


@pytest.mark.skipif(importlib.util.find_spec("megatron.bridge") is None, reason="Megatron-Bridge is not installed (scripts/setup312.sh installs it)")
def test_bridge_mimo_loop_fed_by_the_pipeline_trains_as_the_recipe_and_resumes_exactly(pools, balanced, tmp_path):
    """Images dp 1 + language dp 2, reordering on, wired by exactly the docs' lines: Bridge's loss per iteration (its
    ``lm loss``, the per-token loss of the iteration) equals the recipe's (the balanced run above). Resumed from
    Bridge's checkpoint of iteration 2 (iteration 4's taken back, as if the job had died before its commit),
    iterations 3 and 4 are the uninterrupted run's, bit for bit: the data stream continues from the pipeline's state
    in the iteration folder, and iteration 4's loss needs every module's optimizer state of iteration 2 restored
    (Adam's moments and step; ``torch_dist`` keeps global rank 0's common state alone, the integration shards each
    module's)."""
    from scenarios_megatron_bridge import bridge_run

    save = tmp_path / "checkpoints"
    recipe = [loss for loss, _norms in balanced[0]["training"]]
    whole = pools[3].run(bridge_run, images_dp=1, language_dp=2, reorder="on", iterations=4, save=str(save), save_interval=2, timeout=600)[-1]
    assert len(whole) == 4 and len(recipe) == 3 and recipe[0] != recipe[-1]
    for number, (loss, recipe_loss) in enumerate(zip(whole, recipe), start=1):
        assert loss == pytest.approx(recipe_loss, rel=RELATIVE), f"iteration {number}: Bridge's loss {loss} != the recipe's {recipe_loss}"
    assert any(pipeline_state_folder(save, 2).iterdir())  # the loader state, inside Bridge's iteration folder
    roll_back_bridge_tracker(save, 2, later=4)
    resumed = pools[3].run(bridge_run, images_dp=1, language_dp=2, reorder="on", iterations=4, load=str(save), timeout=600)[-1]
    assert resumed == whole[2:], f"resumed at iteration 2: {resumed}, the uninterrupted run's iterations 3 and 4: {whole[2:]}"


def roll_back_bridge_tracker(folder: Path, iteration: int, *, later: int) -> None:
    """Bridge's trackers (``latest_train_state.pt``, its own; ``latest_checkpointed_iteration.txt``, Megatron-LM's)
    back at ``iteration``, its iteration ``later`` removed: the folder as a job that died before that commit left it."""
    shutil.copyfile(iteration_folder(folder, iteration) / "train_state.pt", folder / "latest_train_state.pt")
    (folder / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    shutil.rmtree(iteration_folder(folder, later))
