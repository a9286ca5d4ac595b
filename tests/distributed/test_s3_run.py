"""`mimo-pipes run` with ``--dataset s3://...`` (its per-rank body in the warm Gloo pool) against a real S3 server on
127.0.0.1: the same micro-batches (``--dump-assignments``) as on the same files on disk, for Parquet read in place,
JSON-lines and LLaVA lists with their images fetched per row, a save_to_disk folder, an Energon dataset and a
metadataset blending it, both read through Energon's storage layer; exact
resume, on the same layout and on another one; a burst
of 503s and cut connections during the run lose and repeat nothing."""

from __future__ import annotations

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from dist_pool import shared_pool  # noqa: E402
from job_runs import run_in_pool  # noqa: E402
from real_data import write_dataset  # noqa: E402
from s3_server import local_s3  # noqa: E402
from scenarios_s3 import run_job_on_s3  # noqa: E402
from test_cli_elastic import dumps_by_step, paired  # noqa: E402
from test_cli_run import read_dumps  # noqa: E402

SIZE = 24
COMMON = ["--quiet", "--micro-batch-size", "4", "--seed", "7", "--scalable-dp", "--intra-microbatch-reorder", "--reorder-window-size", "2"]
OTHER_LAYOUT = ["--component", "language=dp=1", "--component", "images=dp=1,rank_offset=1"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("s3-run")
    with local_s3() as s3:
        sources = {}
        for fmt in ("parquet", "llava", "jsonl", "disk"):
            spec, images = write_dataset(root / fmt, fmt, SIZE)
            url = s3.upload(root / fmt, f"s3://runs/{fmt}")
            sources[fmt] = {"disk": ["--dataset", spec, "--image-folder", str(images)],
                            "s3": ["--dataset", spec.replace(str(root / fmt), url), "--image-folder", f"{url}/images"]}
        # Rows that keep their images' paths across the exchange: the rank that trains on a row fetches its files.
        paths = ["--exchange-image-paths"]
        sources["llava-paths"] = {side: [*flags, *paths] for side, flags in sources["llava"].items()}
        try:
            from energon_data import write_real_rows

            energon = write_real_rows(root / "energon", SIZE, per_shard=5)
            sources["energon"] = {"disk": ["--dataset", str(energon)], "s3": ["--dataset", s3.upload(energon, "s3://runs/energon")]}
            # A metadataset blending that dataset with itself at another weight, stored beside it.
            (root / "blend.yaml").write_text("__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
                                             "      - weight: 2\n        path: energon\n      - weight: 1\n        path: energon\n")
            s3.client.put_object(Bucket="runs", Key="blend.yaml", Body=(root / "blend.yaml").read_bytes())
            sources["blend"] = {"disk": ["--dataset", str(root / "blend.yaml")], "s3": ["--dataset", "s3://runs/blend.yaml"]}
        except ImportError:  # no energon extra
            pass
        yield s3, sources, root


def run_s3(s3, argv, **env):
    outcomes = shared_pool().run(run_job_on_s3, s3.env(MIMO_PIPES_CACHE=str(s3.cache), MIMO_PIPES_S3_BACKOFF_S="0.01", **env), list(argv), timeout=300)
    return outcomes[0]


@pytest.fixture
def s3(data, tmp_path):
    s3, _, _ = data
    s3.proxy.faults.__init__()
    s3.cache = tmp_path / "cache"
    return s3


@pytest.mark.parametrize("fmt", ["parquet", "llava", "llava-paths", "jsonl", "disk", "energon", "blend"])
def test_run_on_s3_consumes_what_it_consumes_on_the_same_files_on_disk(gloo_pool, data, s3, fmt, tmp_path):
    _, sources, _ = data
    if fmt not in sources:
        pytest.skip("needs the energon extra")
    run_in_pool(gloo_pool, [*COMMON, "--steps", "5", *sources[fmt]["disk"], "--dump-assignments", str(tmp_path / "disk")])
    run_s3(s3, [*COMMON, "--steps", "5", *sources[fmt]["s3"], "--dump-assignments", str(tmp_path / "s3")])
    dumps = read_dumps(tmp_path / "s3")
    assert dumps == read_dumps(tmp_path / "disk") and sum(len(records) for records in dumps.values()) == 5 * len(dumps)
    assert any(token for records in dumps.values() for record in records for token in record["image_tokens"])


def test_faults_during_a_run_lose_and_repeat_nothing(gloo_pool, data, s3, tmp_path):
    _, sources, _ = data
    run_in_pool(gloo_pool, [*COMMON, "--steps", "5", *sources["llava"]["disk"], "--dump-assignments", str(tmp_path / "disk")])
    s3.proxy.faults.slow_downs = 5  # fewer than the 6 attempts a request gets, whichever rank draws them
    for k in range(0, SIZE, 3):
        s3.proxy.faults.cuts[f"images/{k:03d}-0.png"] = 1
    run_s3(s3, [*COMMON, "--steps", "5", *sources["llava"]["s3"], "--dump-assignments", str(tmp_path / "s3")])
    assert read_dumps(tmp_path / "s3") == read_dumps(tmp_path / "disk")
    assert s3.proxy.faults.fired["503"] == 5 and s3.proxy.faults.fired["cut"] >= 1


RESUMED = [*COMMON, "--reorder-window-size", "4", "--reorder-across-microbatches", "--steps", "12"]
SAVED_AT, WINDOW = 5, 4


def test_resume_and_elastic_resume_on_s3_are_exact(gloo_pool, data, s3, tmp_path):
    _, sources, _ = data
    flags = [*RESUMED, *sources["parquet"]["s3"]]
    run_s3(s3, [*flags, "--dump-assignments", str(tmp_path / "full")])
    outcome = run_s3(s3, [*flags, "--stop-after", str(SAVED_AT), "--save-state", str(tmp_path / "state"), "--dump-assignments", str(tmp_path / "resumed")])
    assert f"saved state after {SAVED_AT} micro-batches" in outcome["stdout"]
    run_s3(s3, [*flags, "--resume", str(tmp_path / "state"), "--dump-assignments", str(tmp_path / "resumed")])
    assert read_dumps(tmp_path / "resumed") == read_dumps(tmp_path / "full")
    run_s3(s3, [*flags, *OTHER_LAYOUT, "--resume", str(tmp_path / "state"), "--dump-assignments", str(tmp_path / "elastic")])
    full, got = dumps_by_step(tmp_path / "full"), dumps_by_step(tmp_path / "elastic")
    assert paired(tmp_path / "elastic")
    for module in ("language", "images"):
        assert sorted(got[module]) == list(range(SAVED_AT, 12))
        for step in range(SAVED_AT, 2 * WINDOW):
            assert got[module][step] == full[module][step], (module, step)


@pytest.mark.parametrize("fmt", ["parquet", "llava"])
def test_analyze_on_s3_predicts_what_it_predicts_on_disk(data, s3, fmt, tmp_path):
    import json

    from job_runs import analyze_here
    from s3_server import s3_environment

    _, sources, _ = data
    flags = [*COMMON, "--steps", "5"]
    status, _, stderr = analyze_here([*flags, *sources[fmt]["disk"], "--out", str(tmp_path / "disk")])
    assert status == 0, stderr
    with s3_environment(s3.env(MIMO_PIPES_CACHE=str(s3.cache))):
        status, _, stderr = analyze_here([*flags, *sources[fmt]["s3"], "--out", str(tmp_path / "s3")])
    assert status == 0, stderr
    disk, got = (json.loads((tmp_path / side / "analysis.json").read_text()) for side in ("disk", "s3"))
    assert got == disk and set(got) >= {"language", "images"}
