"""`mimo-pipes run` on an Energon dataset (its per-rank body in the warm Gloo pool): the same samples in the
same steps with the same image tokens as on the LLaVA list of the same rows, on two layouts, with and
without windows across micro-batches, rows or samples moving; and exact resume, on the same layout and on
another one."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.energon")  # the energon extra; installed where the tests run

from dist_pool import shared_pool  # noqa: E402
from energon_data import crude_sample, write_real_rows, write_shards  # noqa: E402
from job_runs import analyze_here, run_in_pool, summary_lines  # noqa: E402
from real_data import write_dataset  # noqa: E402
from test_cli_elastic import dumps_by_step, paired  # noqa: E402
from test_cli_run import read_dumps  # noqa: E402

POOL_PRELOAD = ("megatron.energon",)  # the jobs' ranks read energon datasets (tests/distributed/conftest.py)

SIZE = 24
COMMON = ["--quiet", "--micro-batch-size", "4", "--seed", "7", "--scalable-dp", "--intra-microbatch-reorder", "--reorder-window-size", "2"]
LAYOUTS = {
    "language dp 2 + images dp 2": [],
    "language dp 1 + images dp 1": ["--component", "language=dp=1", "--component", "images=dp=1,rank_offset=1"],
}
SETTINGS = {
    "within micro-batches": [],
    "across micro-batches, rows moving": ["--reorder-across-microbatches", "--exchange-payload", "rows"],
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("energon-run")
    llava, folder = write_dataset(root / "llava", "llava", SIZE)
    return {"llava": ["--dataset", llava, "--image-folder", str(folder)],
            "energon": ["--dataset", str(write_real_rows(root / "energon", SIZE, per_shard=5))]}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_run_on_energon_consumes_what_it_consumes_on_the_llava_list(gloo_pool, sources, tmp_path, layout, setting):
    flags = [*COMMON, *LAYOUTS[layout], *SETTINGS[setting], "--steps", "8"]
    dumps = {}
    for name, source in sources.items():
        run_in_pool(gloo_pool, [*flags, *source, "--dump-assignments", str(tmp_path / name)])
        dumps[name] = read_dumps(tmp_path / name)
    assert dumps["energon"] == dumps["llava"]  # every rank: steps, sample ids, image tokens, real tokens
    assert sum(len(records) for records in dumps["energon"].values()) == 8 * len(dumps["energon"])
    assert any(token for records in dumps["energon"].values() for record in records for token in record["image_tokens"])


def test_analyze_predicts_the_same_run_on_energon_as_on_the_llava_list(sources, tmp_path):
    flags = [*COMMON, "--steps", "8"]
    lines = {}
    for name, source in sources.items():
        status, stdout, stderr = analyze_here([*flags, *source, "--out", str(tmp_path / name)])
        assert status == 0, stderr
        lines[name] = summary_lines(stdout)
    assert lines["energon"] == lines["llava"] and set(lines["energon"]) == {"language", "images"}


RESUMED = [*COMMON, "--reorder-window-size", "4", "--reorder-across-microbatches", "--steps", "12"]
SAVED_AT, WINDOW = 5, 4


@pytest.fixture(scope="module")
def saved(sources, tmp_path_factory):
    """The uninterrupted run on Energon data and a state saved inside its second window (language dp 2 + images dp 2)."""
    pool, root = shared_pool(), tmp_path_factory.mktemp("energon-resume")
    run_in_pool(pool, [*RESUMED, *sources["energon"], "--dump-assignments", str(root / "full")])
    outcome = run_in_pool(pool, [*RESUMED, *sources["energon"], "--stop-after", str(SAVED_AT), "--save-state", str(root / "state"),
                                 "--dump-assignments", str(root / "resumed")])
    assert f"saved state after {SAVED_AT} micro-batches" in outcome["stdout"]
    return root


def test_resume_on_energon_continues_the_same_stream(gloo_pool, sources, saved):
    outcome = run_in_pool(gloo_pool, [*RESUMED, *sources["energon"], "--resume", str(saved / "state"), "--dump-assignments", str(saved / "resumed")])
    assert f"micro-batches {SAVED_AT}..11," in outcome["stdout"]
    assert read_dumps(saved / "resumed") == read_dumps(saved / "full")


def test_resume_on_energon_on_another_layout_continues_the_global_stream(gloo_pool, sources, saved, tmp_path):
    run_in_pool(gloo_pool, [*RESUMED, *sources["energon"], *LAYOUTS["language dp 1 + images dp 1"], "--resume", str(saved / "state"),
                            "--dump-assignments", str(tmp_path)])
    full, got = dumps_by_step(saved / "full"), dumps_by_step(tmp_path)
    assert paired(tmp_path)
    for module in ("language", "images"):
        assert sorted(got[module]) == list(range(SAVED_AT, 12))
        for step in range(SAVED_AT, 2 * WINDOW):  # the rest of the window the state was saved in, as saved
            assert got[module][step] == full[module][step], (module, step)
        later = range(2 * WINDOW, 12)  # later windows: the same samples, perhaps in other micro-batches
        assert sorted(i for step in later for i in got[module][step]) == sorted(i for step in later for i in full[module][step])


def test_run_on_another_split_part_consumes_that_parts_samples_in_split_yaml_order(gloo_pool, tmp_path):
    """--split-part val of a dataset whose val part lists shards 3 then 2 is the run on a dataset of those
    shards' samples in that order, on every rank."""
    samples = [crude_sample(i) for i in range(SIZE)]
    names = [f"shard-{k:04d}.tar" for k in range(4)]
    split = write_shards(tmp_path / "split", samples, 6, "__class__: CrudeWebdataset\n",
                         splits={"train": names[:2], "val": [names[3], names[2]]})
    val_only = write_shards(tmp_path / "val-only", samples[18:] + samples[12:18], 6, "__class__: CrudeWebdataset\n")
    flags = [*COMMON, "--steps", "3", "--dataloader-type", "single"]
    run_in_pool(gloo_pool, [*flags, "--dataset", str(split), "--split-part", "val", "--dump-assignments", str(tmp_path / "val")])
    run_in_pool(gloo_pool, [*flags, "--dataset", str(val_only), "--dump-assignments", str(tmp_path / "only")])
    dumps = read_dumps(tmp_path / "val")
    assert dumps == read_dumps(tmp_path / "only") and sum(len(records) for records in dumps.values()) == 3 * len(dumps)
