"""Bad rows through `mimo-pipes run` (its per-rank body on the pool's Gloo ranks): an error naming the
dataset row on every rank, or, with --skip-bad-samples, the same replacement on every module, reported,
and resumed exactly."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from dist_pool import shared_pool
from job_runs import run_in_pool
from PIL import Image
from real_data import write_dataset
from scenarios_jobs import run_job
from test_cli_run import read_dumps

from mimo_pipes.parallel.sharding import global_microbatch_indices

SIZE, BATCH, STEPS, SEED = 24, 4, 6, 11  # 6 steps of 4 read the whole epoch: every bad row is met
BAD = {1: "cannot be decoded", 2: "does not exist", 5: "no assistant text", 9: "more than --seq-length", 13: "outside the image folder"}
COMMON = ["--micro-batch-size", str(BATCH), "--seq-length", "256", "--seed", str(SEED), "--quiet", "--exchange-timeout", "30",
          "--scalable-dp", "--intra-microbatch-reorder", "--reorder-window-size", "2"]


@pytest.fixture(scope="module")
def bad_dataset(tmp_path_factory):
    spec, images = write_dataset(tmp_path_factory.mktemp("bad"), "jsonl", SIZE)
    rows = [json.loads(line) for line in open(spec)]
    (images / rows[1]["images"][0]).write_bytes(b"not a png")
    rows[2]["images"] = ["missing.png"] * len(rows[2]["images"])
    rows[5]["messages"] = [m for m in rows[5]["messages"] if m["role"] == "user"]
    Image.fromarray(np.zeros((600, 600, 3), dtype=np.uint8)).save(images / "page.png")  # ~460 tokens > 256
    rows[9]["images"] = ["page.png"] * len(rows[9]["images"])
    rows[13]["images"] = ["../rows.jsonl"]  # a file beside the image folder: never opened
    with open(spec, "w") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    return ["--dataset", spec, "--image-folder", str(images)]


def test_a_bad_row_stops_every_rank_naming_the_row_and_cause(gloo_pool, bad_dataset):
    outcomes = gloo_pool.run_collect(run_job, [*bad_dataset, *COMMON, "--steps", str(STEPS)], timeout=300)
    assert [status for status, _ in outcomes[:4]] == ["error"] * 4, outcomes  # every rank of the job raised
    for _, error in outcomes[:4]:
        named = set(re.findall(r"dataset row (\d+): ([^\n]*)", error.splitlines()[0]))
        assert named, error[-2000:]
        for row, cause in named:
            assert BAD[int(row)] in cause


@pytest.fixture(scope="module")
def skipped_run(bad_dataset, tmp_path_factory):
    dumps = tmp_path_factory.mktemp("skip-full")
    outcome = run_in_pool(shared_pool(), [*bad_dataset, *COMMON, "--steps", str(STEPS), "--skip-bad-samples", "--dump-assignments", str(dumps)])
    return outcome, read_dumps(dumps)


def test_skip_bad_samples_replaces_each_bad_row_alike_on_every_module(skipped_run):
    outcome, dumps = skipped_run
    assert f"skipped {len(BAD)} bad dataset row(s)" in outcome["stdout"]
    assert "rows " + ", ".join(map(str, sorted(BAD))) in outcome["stdout"]
    listed = re.findall(r"^  row (\d+): (.*)$", outcome["stdout"], flags=re.MULTILINE)
    assert [int(row) for row, _ in listed] == sorted(BAD)  # each bad row once, with its reason
    for row, why in listed:
        assert BAD[int(row)] in why
    attempts = int(re.search(r"; (\d+) attempts to read them\)", outcome["stdout"]).group(1))
    assert attempts >= len(BAD)
    for step in range(STEPS):
        assert dumps[0][step]["sample_ids"] == dumps[2][step]["sample_ids"]  # language and images agree
        assert dumps[1][step]["sample_ids"] == dumps[3][step]["sample_ids"]
        got = sorted(dumps[0][step]["sample_ids"] + dumps[1][step]["sample_ids"])
        read = sorted(int(i) for i in global_microbatch_indices(step, SIZE, BATCH, SEED, True))
        good = [i for i in read if i not in BAD]
        assert not set(got) & set(BAD) and len(got) == BATCH
        assert set(good) <= set(got)  # only the bad rows were replaced


def test_a_resumed_run_skips_the_same_rows(gloo_pool, bad_dataset, skipped_run, tmp_path):
    _, full = skipped_run
    state, dumps = tmp_path / "state", tmp_path / "dumps"
    flags = [*bad_dataset, *COMMON, "--steps", str(STEPS), "--skip-bad-samples", "--dump-assignments", str(dumps)]
    run_in_pool(gloo_pool, [*flags, "--stop-after", "3", "--save-state", str(state)])
    run_in_pool(gloo_pool, [*flags, "--resume", str(state)])
    assert read_dumps(dumps) == full
