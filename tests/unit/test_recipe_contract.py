"""The recipe contract, written once (``Recipe`` and ``Trainer`` in mimo_pipes.cli.job.recipe) and checked once
(``contract_problems``, what ``load_recipe`` refuses by): the project's data recipe and its training recipe both
satisfy it, and a recipe that falls short in any member a command calls is refused naming that member."""

from __future__ import annotations

import types

import pytest

from mimo_pipes.cli.job.recipe import OPTIONAL, Recipe, contract_problems, load_recipe
from mimo_pipes.errors import ConfigError
from mimo_pipes_recipes import tiny_mimo_train, vlm_sft

EVERY = ("prepare", "build", "row_counts")


@pytest.mark.parametrize(("recipe", "needs"), [(vlm_sft, EVERY), (tiny_mimo_train, (*EVERY, "Trainer"))], ids=["vlm_sft", "tiny_mimo_train"])
def test_both_recipes_satisfy_the_contract(recipe, needs):
    assert contract_problems(recipe, needs) == []
    if "Trainer" in needs:
        assert isinstance(tiny_mimo_train.Trainer.iteration, property)


def test_every_member_the_contract_names_is_checked():
    declared = {name for name in vars(Recipe) if not name.startswith("_")} | set(Recipe.__annotations__)
    assert declared == {*EVERY, "Trainer", *OPTIONAL}


def _recipe(**members) -> types.ModuleType:
    module = types.ModuleType("short_recipe")
    for name in ("prepare", "build", "row_counts", "Trainer"):
        setattr(module, name, getattr(tiny_mimo_train, name))
    for name, member in members.items():
        setattr(module, name, member)
    return module


def _trainer(**members) -> type:
    return type("ShortTrainer", (tiny_mimo_train.Trainer,), members)


@pytest.mark.parametrize(("members", "problem"), [
    ({"build": lambda config: None}, "build() takes no layout as parameter 2"),
    ({"build": lambda config, layout, *, consumed_microbatches: None}, "build() needs consumed_microbatches, which is never passed"),
    ({"build": lambda layout, config: None}, "build() takes no config as parameter 1"),
    ({"row_counts": lambda config, *, real_tokens, runs: None}, "row_counts() takes no progress= keyword"),
    ({"failed_after_exchange": lambda config, rows: None}, "failed_after_exchange() takes no progress as parameter 3"),
    ({"prepare": lambda config: None}, "prepare() takes no log= keyword"),
    ({"row_counts": lambda config, *, real_tokens, runs, progress=None, cache: None}, "row_counts() needs cache, which is never passed"),
    ({"check_layout": lambda: None}, "check_layout() takes no topology as parameter 1"),
    ({"Trainer": _trainer(close=None)}, "Trainer has no close()"),
    ({"Trainer": _trainer(iteration=None)}, "Trainer has no iteration"),
    ({"Trainer": _trainer(load_state_dict=lambda self: None)}, "Trainer.load_state_dict() takes no state as parameter 2"),
    ({"Trainer": _trainer(__init__=lambda self, config, options, groups, topology: None)}, "Trainer.__init__() takes no loader as parameter 6"),
])
def test_a_member_that_falls_short_is_named(members, problem):
    assert contract_problems(_recipe(**members), (*EVERY, "Trainer")) == [problem]


def test_extra_parameters_with_defaults_and_catch_alls_are_accepted():
    lenient = _recipe(build=lambda config, layout, *, consumed_microbatches=0, processing="thread": None,
                      row_counts=lambda config, **options: None, prepare=lambda *args, **kwargs: None,
                      failed_after_exchange=lambda *args: None)
    assert contract_problems(lenient, (*EVERY, "Trainer")) == []


def test_a_recipe_file_that_falls_short_is_refused_naming_the_member(tmp_path):
    path = tmp_path / "one_argument.py"
    path.write_text("def build(config):\n    return None\n")
    with pytest.raises(ConfigError, match=r"^--recipe: .*one_argument.py build\(\) takes no layout as parameter 2, which `mimo-pipes run` calls"):
        load_recipe(str(path))
    path = tmp_path / "plain_build.py"
    path.write_text("def build(config, layout):\n    return None\n")
    assert load_recipe(str(path)).build(None, None) is None  # what the commands call: consumed_microbatches= is the recipe's own
