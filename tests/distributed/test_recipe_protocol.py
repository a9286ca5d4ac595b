"""Recipes as a protocol: a recipe file written here (not installed, named by its path) is what `run`,
`analyze` and `train` call: its `prepare` before any rank starts, its `build` on every rank, its
`row_counts` for analyze, and its `Trainer`; a recipe that lacks what a command needs is refused naming
`--recipe`."""

from __future__ import annotations

import json
import textwrap

import pytest
from job_runs import analyze_here, run_in_pool, summary_lines, train_in_pool
from test_analyze import assert_analysis_is_the_summary

from mimo_pipes.cli.job.recipe import load_recipe
from mimo_pipes.cli.main import main
from mimo_pipes.config import PipelineConfig
from mimo_pipes.errors import ConfigError

# Every other row of the embedded data, in reverse: a recipe that reads its own way.
RECIPE = '''
from mimo_pipes_recipes import tiny_mimo_train, vlm_sft

Trainer = tiny_mimo_train.Trainer
PREPARED = []


class EveryOtherRow:
    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset) // 2

    def __getitem__(self, index):
        return self.dataset[len(self.dataset) - 1 - 2 * index]


def prepare(config, log):
    vlm_sft.prepare(config, log)
    log("the test's recipe prepared")


def build(config, layout, *, consumed_microbatches=0):
    processor = vlm_sft.open_processor(config)
    dataset = EveryOtherRow(vlm_sft.open_source(vlm_sft.dataset_path(config)))
    return vlm_sft.pipeline(dataset, config, layout, map_fn=processor, image_token_id=processor.placeholder_ids,
                            pad_values={"input_ids": processor.pad_token_id, "labels": -100},
                            vision_fields=processor.vision_fields, consumed_microbatches=consumed_microbatches)


def row_counts(config, *, real_tokens, runs, progress=None):
    from mimo_pipes.analysis.row_counts import count_rows

    dataset = EveryOtherRow(vlm_sft.open_source(vlm_sft.dataset_path(config)))
    return count_rows(dataset, vlm_sft.open_processor(config), real_tokens=real_tokens, runs=runs, use_cache=False)
'''
FLAGS = ["--micro-batch-size", "4", "--steps", "4", "--embedded-samples", "48", "--seed", "2", "--quiet", "--scalable-dp",
         "--intra-microbatch-reorder", "--component", "language=dp=2", "--component", "images=dp=1,rank_offset=2"]


def assert_the_recipes_rows(consumed: list[tuple[int, int]]) -> None:
    """Sample i of the recipe is embedded row 47 - 2i: its image tokens say so (the default graph's row i has other ones)."""
    embedded = load_recipe("mimo_pipes_recipes.vlm_sft").row_counts(PipelineConfig(embedded_samples=48), real_tokens=False, runs=False)
    tokens = embedded.image_tokens.tolist()
    assert consumed and all(0 <= i < 24 and count == tokens[47 - 2 * i] for i, count in consumed), consumed
    assert any(count != tokens[i] for i, count in consumed)


@pytest.fixture(scope="module")
def recipe_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("recipe") / "every_other_row.py"
    path.write_text(textwrap.dedent(RECIPE))
    return str(path)


def test_run_and_analyze_honour_a_recipe_file(gloo_pool, recipe_file, tmp_path):
    flags = [*FLAGS, "--recipe", recipe_file]
    outcome = run_in_pool(gloo_pool, [*flags, "--dump-assignments", str(tmp_path / "dumps")])
    assert "the test's recipe prepared" in outcome["stderr"]
    assert_the_recipes_rows([(i, t) for r in outcome["result"].records for i, t in zip(r["sample_ids"], r["image_tokens"])])
    status, _, stderr = analyze_here([*flags, "--out", str(tmp_path / "analysis")])
    assert status == 0, stderr
    analysis = json.loads((tmp_path / "analysis" / "analysis.json").read_text())
    assert_analysis_is_the_summary(analysis, summary_lines(outcome["stdout"]))


def test_train_honours_a_recipe_file(gloo_pool, recipe_file):
    outcomes = train_in_pool(gloo_pool, [*FLAGS, "--recipe", recipe_file, "--seq-length", "1536", "--global-batch-size", "8"])
    steps = [step for outcome in outcomes if outcome for step in outcome["result"].mine]
    assert_the_recipes_rows([(i, t) for step in steps for r in step.records for i, t in zip(r["sample_ids"], r["image_tokens"])])
    assert all(step.loss is not None for step in steps if step.module == "language")


def test_a_recipe_without_what_a_command_calls_is_refused(tmp_path, capsys):
    path = tmp_path / "half.py"
    path.write_text("def prepare(config, log):\n    pass\n")
    with pytest.raises(ConfigError, match=r"--recipe: .*half.py has no build\(\), which `mimo-pipes run` calls"):
        load_recipe(str(path))
    assert main(["analyze", "--recipe", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "has no row_counts(), which `mimo-pipes analyze` calls" in capsys.readouterr().err
    assert main(["run", "--recipe", "no_such_recipe_module"]) == 2
    assert capsys.readouterr().err.strip() == (
        "mimo-pipes run: error: --recipe: no module named 'no_such_recipe_module' (give an importable module or a .py file)")
    assert main(["train", "--recipe", str(tmp_path / "missing.py"), "--steps", "8"]) == 2
    assert "--recipe: " in capsys.readouterr().err
