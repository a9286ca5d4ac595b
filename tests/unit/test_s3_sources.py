"""``--dataset s3://...`` and ``--image-folder s3://...`` against a real S3 server (moto's, on 127.0.0.1) behind a
fault proxy: the rows and image bytes equal those of the same files on disk for every format; a Parquet source
reads only the row groups asked of it; 503 bursts, cut connections and slow objects lose and repeat nothing;
a missing bucket or key, denied credentials, an unreachable endpoint are one line naming the URL."""

from __future__ import annotations

import contextlib
import io

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from fresh_cache import fresh_cache  # noqa: E402
from real_data import write_dataset  # noqa: E402
from s3_server import local_s3, s3_environment, shared_botocore_data  # noqa: E402

from mimo_pipes.data.processing.media_sizes import encoded_media  # noqa: E402
from mimo_pipes.data.sources.open_source import check_source, dataset_folder, open_source  # noqa: E402
from mimo_pipes.errors import ConfigError, SampleError  # noqa: E402

SIZE = 12
FORMATS = ("parquet", "jsonl", "llava", "disk")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("s3-data")
    with shared_botocore_data(), local_s3() as s3:
        specs = {}
        for fmt in FORMATS:
            spec, images = write_dataset(root / fmt, fmt, SIZE)
            url = s3.upload(root / fmt, f"s3://data/{fmt}")
            local = spec.replace(str(root / fmt), url)
            specs[fmt] = {"local": spec, "images": str(images), "s3": local, "s3_images": f"{url}/images"}
        yield s3, specs


@pytest.fixture
def s3(server, tmp_path, monkeypatch):
    s3, specs = server
    monkeypatch.setenv("MIMO_PIPES_CACHE", str(fresh_cache(tmp_path / "cache")))  # the S3 copies start empty
    s3.proxy.faults.__init__()
    with s3_environment(s3.env(MIMO_PIPES_S3_BACKOFF_S="0.01", MIMO_PIPES_S3_TIMEOUT_S="2")):
        yield s3, specs


def rows_of(spec: str, folder: str) -> list[dict]:
    dataset = open_source(spec)
    return [encoded_media({**dataset[i]}, folder, i) for i in range(len(dataset))]


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_and_images_from_s3_equal_those_of_the_same_files_on_disk(s3, fmt):
    _, specs = s3
    spec = specs[fmt]
    from_disk = rows_of(spec["local"], spec["images"])
    from_s3 = rows_of(spec["s3"], spec["s3_images"])
    assert len(from_s3) == SIZE and from_s3 == from_disk
    if fmt != "disk":  # images resolve in the dataset's own S3 folder by default, as on disk
        assert str(dataset_folder(spec["s3"])) == spec["s3"].rsplit("/", 1)[0]


def test_parquet_reads_the_footers_then_only_the_row_groups_asked_for(s3):
    server, specs = s3
    dataset = open_source(specs["parquet"]["s3"])
    server.proxy.faults.gets.clear()
    before = dataset.client.requests
    assert dataset[SIZE - 1]["messages"] == rows_of(specs["parquet"]["local"], specs["parquet"]["images"])[SIZE - 1]["messages"]
    dataset[SIZE - 2]  # the same row group: cached
    assert dataset.client.requests - before == 1
    assert list(server.proxy.faults.gets) == ["/data/parquet/part-1.parquet"]


def test_transient_faults_lose_and_repeat_nothing(s3):
    server, specs = s3
    spec = specs["llava"]
    faults = server.proxy.faults
    faults.slow_downs = 4  # a burst of 503s on whatever comes next
    faults.cuts["images/003-0.png"] = 1  # a connection cut half-way through an image
    faults.cuts["part-0.parquet"] = 1
    faults.slow["images/005-0.png"] = (1.5, 1)  # longer than the read timeout (1 s here: the wait is the test's), once
    with s3_environment(server.env(MIMO_PIPES_S3_BACKOFF_S="0.01", MIMO_PIPES_S3_TIMEOUT_S="1")):
        from_s3 = rows_of(spec["s3"], spec["s3_images"])
        assert from_s3 == rows_of(spec["local"], spec["images"])
        parquet = open_source(specs["parquet"]["s3"])
        on_disk = open_source(specs["parquet"]["local"])
        assert [parquet[i] for i in range(SIZE)] == [on_disk[i] for i in range(SIZE)]
    assert faults.fired == {"503": 4, "cut": 2, "slow": 1}


def test_images_fetched_ahead_are_those_processing_reads_and_a_failed_fetch_is_fetched_again(s3):
    import time

    from mimo_pipes.data.storage.s3_images import prefetch_media

    server, specs = s3
    spec = specs["llava"]
    dataset = open_source(spec["s3"])
    server.proxy.faults.cuts["images/002-0.png"] = 2  # the fetch ahead fails for good (2 attempts), processing retries
    with s3_environment(server.env(MIMO_PIPES_S3_ATTEMPTS="2", MIMO_PIPES_S3_BACKOFF_S="0.01")):
        rows = [{**dataset[i]} for i in range(4)]
        assert sum(prefetch_media(row, spec["s3_images"]) for row in rows) == 4
        deadline = time.monotonic() + 20
        while (server.proxy.faults.gets.total() < 3 or server.proxy.faults.fired["cut"] < 2) and time.monotonic() < deadline:
            time.sleep(0.05)  # the three whole fetches ahead and the failed one done
        assert [prefetch_media(row, spec["s3_images"]) for row in (rows[0], rows[1], rows[3])] == [0, 0, 0]  # held: nothing to start
        gets = server.proxy.faults.gets.total()
        assert [encoded_media(row, spec["s3_images"], i) for i, row in enumerate(rows)] == rows_of(spec["local"], spec["images"])[:4]
        assert server.proxy.faults.gets.total() == gets + 1  # only the image whose fetch ahead failed


def test_a_missing_image_is_the_rows_missing_image(s3):
    _, specs = s3
    with pytest.raises(SampleError, match=r"dataset row 3: image 0 'nope.png' does not exist under the image folder s3://data/llava/images"):
        encoded_media({"images": ["nope.png"]}, specs["llava"]["s3_images"], 3)
    with pytest.raises(SampleError, match="outside the image folder"):
        encoded_media({"images": ["../parquet/part-0.parquet"]}, specs["llava"]["s3_images"], 3)


@pytest.mark.parametrize(("url", "reason"), [
    ("s3://no-such-bucket/rows.parquet", "no such bucket|no such key"),
    ("s3://data/parquet/missing.parquet", "no such key"),
    ("s3://data/parquet/none-*.parquet", "matches no object"),
    ("s3://no-such-bucket/folder", "no such bucket|no such key"),
])
def test_missing_data_is_one_line_naming_the_url(s3, url, reason):
    with pytest.raises(ConfigError, match=reason) as error:
        check_source(url)
    text = str(error.value)
    assert "\n" not in text and url.split("*")[0].rsplit("/", 1)[0] in text


def test_denied_credentials_and_unreachable_endpoint_are_one_line(s3):
    server, specs = s3
    url = specs["parquet"]["s3"]
    with s3_environment(server.env(AWS_ACCESS_KEY_ID="bad", MIMO_PIPES_S3_ATTEMPTS="1")):
        server.proxy.faults.deny_key = "bad"
        with pytest.raises(ConfigError, match="access denied: check the credentials") as error:
            check_source(url)
        assert "\n" not in str(error.value) and "s3://data/parquet" in str(error.value)
    server.proxy.faults.deny_key = None
    from s3_server import free_port

    with s3_environment(server.env(AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}", MIMO_PIPES_S3_ATTEMPTS="2")):
        with pytest.raises(ConfigError, match="cannot reach the endpoint http://127.0.0.1") as error:
            check_source(url)
        assert "\n" not in str(error.value)


def test_check_command_names_the_url_of_a_missing_key(s3):
    from mimo_pipes.cli.main import main

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        status = main(["check", "--dataset", "s3://data/jsonl/missing.jsonl"])
    assert status == 2
    lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
    assert len(lines) == 1 and "s3://data/jsonl/missing.jsonl" in lines[0] and "no such key" in lines[0]


def test_check_command_checks_every_row_in_s3(s3):
    from mimo_pipes.cli.main import main

    _, specs = s3
    stdout = io.StringIO()
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(stdout):
        status = main(["check", "--dataset", specs["llava"]["s3"], "--image-folder", specs["llava"]["s3_images"]])
    assert status == 0, stdout.getvalue()


def test_without_s3fs_one_line_says_what_to_install(monkeypatch, tmp_path):
    import sys

    from mimo_pipes.data.storage.s3_store import reset_store

    monkeypatch.setitem(sys.modules, "s3fs", None)
    reset_store()
    with pytest.raises(ConfigError, match=r'pip install "mimo-pipes\[s3\]"'):
        check_source("s3://data/parquet/part-*.parquet")
    reset_store()


@pytest.fixture(scope="module")
def energon_url(server, tmp_path_factory):
    pytest.importorskip("megatron.energon")
    from energon_data import write_real_rows

    s3, _ = server
    local = write_real_rows(tmp_path_factory.mktemp("energon") / "ds", SIZE, per_shard=5)
    return s3.upload(local, "s3://energon/ds"), str(local)


def test_an_energon_dataset_in_s3_reads_as_on_disk_through_energons_storage_layer(s3, energon_url):
    server, _ = s3
    url, local = energon_url
    faults = server.proxy.faults
    check_source(url)
    remote = open_source(url)
    assert type(remote).__name__ == "EnergonDataset" and remote.remote == url
    faults.gets.clear()
    faults.slow_downs = 3
    faults.cuts["shard-0001.tar"] = 1
    on_disk = open_source(local)
    assert [remote[i] for i in range(SIZE)] == [on_disk[i] for i in range(SIZE)]
    assert faults.fired["503"] == 3 and faults.fired["cut"] == 1
    shards = {path: count for path, count in faults.gets.items() if path.endswith(".tar")}
    assert sum(shards.values()) == SIZE  # one range request a sample, none repeated: the index is local
    faults.gets.clear()
    assert remote[7] == on_disk[7] and dict(faults.gets) == {"/energon/ds/shard-0001.tar": 1}


def test_a_sample_of_an_energon_dataset_in_s3_is_requested_as_often_as_the_attempts_setting_says(s3, energon_url, caplog):
    """One retry layer, the library's: boto3's and the multi-storage client's own retries (3 tries each, multiplied,
    with waits of a second or more) would send many more requests and ignore the settings; and the multi-storage
    client logs no failed try of its own (an "All retry attempts failed" line on every try the library repeats)."""
    import logging

    caplog.set_level(logging.WARNING, logger="multistorageclient")
    server, _ = s3
    url, _ = energon_url
    faults = server.proxy.faults
    for attempts in (1, 3):
        with s3_environment(server.env(MIMO_PIPES_S3_ATTEMPTS=str(attempts), MIMO_PIPES_S3_BACKOFF_S="0.01")):
            remote = open_source(url)
            faults.__init__()
            faults.slow_downs = 20  # every GET answers 503 (SlowDown) from here
            with pytest.raises(Exception, match="503|SlowDown|[Uu]navailable"):
                remote[7]
            assert faults.fired["503"] == attempts
            faults.slow_downs = 0
            assert remote[7] == open_source(energon_url[1])[7]  # and the next read, once the store answers, is whole
    assert not [record.getMessage() for record in caplog.records if record.name.startswith("multistorageclient")]


def test_a_missing_energon_shard_in_s3_is_found_before_the_ranks_start(s3, energon_url):
    server, _ = s3
    url, _ = energon_url
    names = [f".nv-meta/{name}" for name in ("dataset.yaml", "split.yaml", ".info.json", "index.sqlite", "index.uuid")]
    names += [f"shard-000{k}{suffix}" for k in range(3) for suffix in (".tar", ".tar.idx") if (k, suffix) != (1, ".tar")]
    for name in names:  # the dataset without its shard 1
        server.client.copy_object(Bucket="energon", Key=f"cut/{name}", CopySource={"Bucket": "energon", "Key": f"ds/{name}"})
    from mimo_pipes.data.sources.energon_checks import source_problems

    problems, unread = source_problems(open_source("s3://energon/cut"))
    assert [p.kind for p in problems] == ["missing shard"] and "shard-0001.tar" in problems[0].text
    assert [row for row in range(SIZE) if unread(row)] == list(range(5, 10))


@pytest.mark.parametrize("fmt", ["llava", "disk", "parquet"])
def test_a_sources_fingerprint_is_its_objects_not_where_or_when_it_was_copied(s3, fmt, tmp_path, monkeypatch):
    """What a saved state checks on resume: equal on every node (another cache, another copy), nothing read for it."""
    server, specs = s3
    first = open_source(specs[fmt]["s3"])._fingerprint
    monkeypatch.setenv("MIMO_PIPES_CACHE", str(tmp_path / "another-cache"))
    server.proxy.faults.gets.clear()
    again = open_source(specs[fmt]["s3"])
    assert again._fingerprint == first and first.startswith("s3:")
    if fmt == "parquet":  # in place: a listing of the bucket, then each file's footer, one request each
        objects = {path: count for path, count in server.proxy.faults.gets.items() if path != "/data"}
        assert objects == {"/data/parquet/part-0.parquet": 1, "/data/parquet/part-1.parquet": 1}


def test_check_names_a_bad_line_of_an_s3_file_by_its_url(s3, tmp_path):
    from mimo_pipes.cli.main import main

    server, specs = s3
    lines = open(specs["jsonl"]["local"]).read().splitlines()
    lines[2] = "{not json"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "rows.jsonl").write_text("\n".join(lines) + "\n")
    url = server.upload(tmp_path / "bad", "s3://data/bad-jsonl") + "/rows.jsonl"
    stdout = io.StringIO()
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(stdout):
        status = main(["check", "--dataset", url, "--image-folder", specs["jsonl"]["s3_images"]])
    assert status == 1
    named = [line for line in stdout.getvalue().splitlines() if "line 3" in line]
    assert named and all(f"{url} line 3" in line for line in named), stdout.getvalue()


def test_a_parquet_source_in_s3_pickles_for_worker_processes(s3):
    import pickle

    _, specs = s3
    dataset = open_source(specs["parquet"]["s3"])
    copy = pickle.loads(pickle.dumps(dataset))
    assert len(copy) == len(dataset) and copy[5] == dataset[5] and copy.cache is not dataset.cache


def test_the_local_copies_stay_within_their_bound_and_a_copy_over_it_is_refused(s3):
    from mimo_pipes.data.storage.disk_copies import copies_root, folder_bytes

    server, specs = s3

    def held() -> dict[str, int]:
        return {copy.name: folder_bytes(copy) for copy in copies_root().iterdir() if not copy.name.startswith(".")}

    open_source(specs["jsonl"]["s3"])  # annotation files with their Arrow conversion
    (jsonl,) = held()
    open_source(specs["disk"]["s3"])  # a save_to_disk folder
    sizes = held()
    assert len(sizes) == 2
    bound = max(sizes.values()) + min(sizes.values()) // 2  # room for either copy, not for both
    with s3_environment(server.env(MIMO_PIPES_S3_DISK_MB=str(bound / 2**20))):
        for fmt, kept in (("jsonl", {jsonl}), ("disk", set(sizes) - {jsonl})):  # used again: the other one goes
            dataset = open_source(specs[fmt]["s3"])
            assert set(held()) == kept and sum(held().values()) <= bound
            assert len(dataset) == SIZE and dataset[SIZE - 1] == open_source(specs[fmt]["local"])[SIZE - 1]
    with s3_environment(server.env(MIMO_PIPES_S3_DISK_MB="0.001")), pytest.raises(ConfigError, match=r"MIMO_PIPES_S3_DISK_MB.*s3://data/jsonl.*MiB"):
        open_source(specs["jsonl"]["s3"])


@pytest.fixture(scope="module")
def energon_blend(server, energon_url, tmp_path_factory):
    import shutil

    from energon_data import crude_sample, write_shards

    s3, _ = server
    root = tmp_path_factory.mktemp("blend")
    shutil.copytree(energon_url[1], root / "ds")  # the dataset of energon_url, written once
    write_shards(root / "small", [crude_sample(100 + i) for i in range(3)], 2, "__class__: CrudeWebdataset\n")
    (root / "blend.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - weight: 3\n        path: ds\n      - weight: 1\n        path: small\n")
    return s3.upload(root, "s3://blends/root") + "/blend.yaml", str(root / "blend.yaml")


def test_an_energon_metadataset_in_s3_blends_as_on_disk_through_energons_storage_layer(s3, energon_blend):
    from mimo_pipes.data.sources.energon_blend import EnergonBlend

    url, local = energon_blend
    check_source(url)
    remote, on_disk = open_source(url), open_source(local)
    assert isinstance(remote, EnergonBlend) and len(remote) == len(on_disk) == SIZE + 4
    assert all(name.startswith("msc://_s3-blends/root/") for name in remote.names)
    assert [remote[k] for k in range(len(remote))] == [on_disk[k] for k in range(len(on_disk))]


def test_a_metadataset_in_s3_naming_a_missing_dataset_is_one_line(s3, energon_blend):
    server, _ = s3
    server.client.put_object(Bucket="blends", Key="root/bad.yaml", Body=(
        b"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        b"      - weight: 1\n        path: ds\n      - weight: 1\n        path: nope\n"))
    with pytest.raises(ConfigError, match=r"bad.yaml.*nope") as error:
        check_source("s3://blends/root/bad.yaml")
    assert "\n" not in str(error.value)


def test_analyze_starts_each_rows_image_fetches_once_ahead_of_counting_it(s3, monkeypatch):
    from mimo_pipes.analysis.row_counts import count_rows
    from mimo_pipes.data.embedded.builtin_processor import default_processor_path
    from mimo_pipes.data.processing.processor import load_processor
    from mimo_pipes.data.storage import s3_images

    _, specs = s3
    spec = specs["llava"]
    started, fetch = [], s3_images.prefetch_media
    monkeypatch.setattr(s3_images, "prefetch_media", lambda row, folder: started.append(row["sample_id"]) or fetch(row, folder))
    counts = {side: count_rows(open_source(spec[side]), load_processor(default_processor_path(), 1024, image_folder=spec[folder]),
                               use_cache=False).image_tokens.tolist() for side, folder in (("s3", "s3_images"), ("local", "images"))}
    assert started == list(range(SIZE)) and counts["s3"] == counts["local"] and any(counts["s3"])
