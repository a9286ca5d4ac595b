"""Megatron-Energon datasets as a source: sample k is the k-th in split.yaml's shard order, row for row the
same as the LLaVA list of the same data (images as stored, undecoded); VQA and captioning samples as one
exchange; blends in one deterministic order; every unreadable sample a bad row naming its shard and key,
listed by `check`; open files bounded however many shards."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import struct
import sys
from fractions import Fraction
from pathlib import Path

import pytest

pytest.importorskip("megatron.energon")  # the energon extra; installed where the tests run

import torch  # noqa: E402
from energon_data import CAPTION_YAML, VQA_YAML, crude_sample, write_real_rows, write_shards  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from real_data import image, num_images, png, write_dataset  # noqa: E402

from mimo_pipes.cli.main import main  # noqa: E402
from mimo_pipes.data import bad_rows  # noqa: E402
from mimo_pipes.data.embedded.builtin_processor import default_processor_path  # noqa: E402
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.data.sources.energon_blend import BlendOrder, EnergonBlend, weighted_counts  # noqa: E402
from mimo_pipes.data.sources.energon_source import OPEN_SHARDS, EnergonDataset  # noqa: E402
from mimo_pipes.data.sources.open_source import open_source  # noqa: E402
from mimo_pipes.errors import ConfigError, SampleError  # noqa: E402

SIZE = 24


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str, Path]:
    """(Energon dataset, LLaVA list, its image folder) holding the same rows."""
    root = tmp_path_factory.mktemp("energon")
    llava, folder = write_dataset(root / "llava", "llava", SIZE)
    return str(write_real_rows(root / "energon", SIZE, per_shard=5)), llava, folder


@pytest.fixture(scope="module")
def processor_for(pair):
    return load_processor(default_processor_path(), 1024, image_folder=str(pair[2]))


def _same(a: dict, b: dict) -> None:
    b = {name: value for name, value in b.items() if name != "id"}  # the LLaVA rows' own column
    assert set(a) == set(b)
    for name, value in a.items():
        assert torch.equal(value, b[name]) if isinstance(value, torch.Tensor) else value == b[name], name


def test_sample_k_is_the_kth_of_the_shards_in_split_order_with_images_as_stored(pair, processor_for):
    energon, llava, folder = pair
    dataset, rows = open_source(energon), open_source(llava)
    assert len(dataset) == len(rows) == SIZE and dataset.locate(7) == (1, 2)  # 5 samples a shard
    for i in range(SIZE):
        row = dataset[i]
        assert [item["bytes"] for item in row["images"]] == [(folder / f"{i:03d}-{k}.png").read_bytes() for k in range(num_images(i))]
        assert all(item["path"] == f"shard-{i // 5:04d}.tar/{i:06d}.{k}.png" for k, item in enumerate(row["images"]))
        _same(processor_for(dict(row, sample_id=i)), processor_for(dict(rows[i], sample_id=i)))


def test_split_yaml_decides_the_order_of_the_shards(tmp_path):
    samples = [crude_sample(i) for i in range(6)]
    dataset = EnergonDataset(write_shards(tmp_path, samples, 2, "__class__: CrudeWebdataset\n",
                                          names=["shard-0002.tar", "shard-0000.tar", "shard-0001.tar"]))
    firsts = [dataset[k]["conversations"][0]["value"].split()[-1] for k in range(6)]
    assert firsts == ["4?", "5?", "0?", "1?", "2?", "3?"]


def test_vqa_and_captioning_samples_are_one_exchange_like_their_llava_rows(tmp_path):
    processor = load_processor(default_processor_path(), 1024)
    jpg = [png(image(i, 0)) for i in range(3)]  # the part is named jpg; the bytes are what the header says
    vqa = EnergonDataset(write_shards(tmp_path / "vqa", [
        {"__key__": f"q{i}", "jpg": jpg[i], "json": json.dumps({"question": f"what is {i}?", "answers": [f"it is {i}", "no"]}).encode()}
        for i in range(3)], 3, VQA_YAML))
    caption = EnergonDataset(write_shards(tmp_path / "cap", [
        {"__key__": f"c{i}", "jpg": jpg[i], "txt": f"a picture of {i}".encode()} for i in range(3)], 3, CAPTION_YAML))
    for i in range(3):
        image_bytes = {"bytes": jpg[i], "path": None}
        asked = {"images": [image_bytes], "conversations": [{"from": "human", "value": f"<image>\nwhat is {i}?"}, {"from": "gpt", "value": f"it is {i}"}]}
        captioned = {"images": [image_bytes], "conversations": [{"from": "human", "value": "<image>"}, {"from": "gpt", "value": f"a picture of {i}"}]}
        _same(processor(dict(vqa[i], sample_id=i)), processor(dict(asked, sample_id=i)))
        _same(processor(dict(caption[i], sample_id=i)), processor(dict(captioned, sample_id=i)))


def test_other_sample_types_and_sample_excludes_are_refused_in_one_line(tmp_path):
    folder = write_shards(tmp_path / "ocr", [crude_sample(1)], 1, "sample_type:\n  __class__: OCRSample\nfield_map:\n  image: png\n")
    with pytest.raises(ConfigError, match=r"dataset: .*dataset.yaml declares samples of type 'OCRSample'; mimo-pipes reads VQASample"):
        open_source(str(folder))
    folder = write_shards(tmp_path / "vqa", [crude_sample(1)], 1, "sample_type:\n  __class__: VQASample\nfield_map:\n  image: 0.png\n")
    with pytest.raises(ConfigError, match="the field_map lacks context, answers"):
        open_source(str(folder))


def test_the_missing_extra_is_named(monkeypatch, pair):
    monkeypatch.setitem(sys.modules, "megatron.energon", None)
    with pytest.raises(ConfigError, match=r'dataset: reading Energon datasets needs megatron-energon: pip install "mimo-pipes\[energon\]"'):
        open_source(pair[0])


# ----------------------------------------------------------------------------------------------------
# What breaks on clusters


def check(*argv: str) -> tuple[int, list[str], str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(["check", "--quiet", "--num-workers", "1", *argv])
    return status, stdout.getvalue().splitlines(), stderr.getvalue()


@pytest.fixture
def broken(tmp_path) -> Path:
    return write_broken(tmp_path)


def write_broken(tmp_path: Path) -> Path:
    """Six shards of 2 samples: shard 1 missing, shard 2 cut inside its second sample, shard 3 rewritten
    with other sizes after energon prepare, sample 8's image corrupt, sample 10 without a conversation."""
    samples = [crude_sample(i) for i in range(12)]
    for sample in samples:
        sample.setdefault("0.png", png(image(0, 0)))  # one image each, so each row has one to break
        sample["json"] = json.dumps({"conversations": [{"from": "human", "value": "<image>\nq"}, {"from": "gpt", "value": "a"}]}).encode()
    samples[8]["0.png"] = samples[8]["0.png"][:40] + b"\0" * 200
    del samples[10]["json"]
    folder = write_shards(tmp_path, samples, 2, "__class__: CrudeWebdataset\n")
    (folder / "shard-0001.tar").unlink()
    cut = folder / "shard-0002.tar"
    offsets = struct.unpack("QQQ", (folder / "shard-0002.tar.idx").read_bytes())  # sample 4, sample 5, the end
    cut.write_bytes(cut.read_bytes()[: (offsets[1] + offsets[2]) // 2])
    import webdataset as wds
    with wds.TarWriter(str(folder / "shard-0003.tar")) as writer:  # the same keys, other sizes: its index is out of date
        for sample in samples[6:8]:
            writer.write({"__key__": sample["__key__"], "json": b"{}", "0.png": png(image(9, 9)) * 2})
    return folder


EXPECTED = {  # dataset row: (kind, what its line names)
    2: (bad_rows.MISSING_SHARD, "shard-0001.tar key 000002: the shard"),
    3: (bad_rows.MISSING_SHARD, "shard-0001.tar key 000003: the shard"),
    5: (bad_rows.TRUNCATED_SHARD, "shard-0002.tar key 000005: the shard ends at byte "),
    6: (bad_rows.STALE_INDEX, "shard-0003.tar key 000006: "),
    7: (bad_rows.STALE_INDEX, "shard-0003.tar key 000007: "),
    8: (bad_rows.UNREADABLE_IMAGE, "image 0 (shard-0004.tar/000008.0.png) cannot be decoded"),
    10: (bad_rows.UNFIT_SAMPLE, "shard-0005.tar key 000010: a crude sample needs a json part"),
}


def test_each_unreadable_sample_fails_in_one_line_naming_its_shard_and_key(broken):
    dataset = open_source(str(broken))
    processor = load_processor(default_processor_path(), 1024)
    for row in range(12):
        if row not in EXPECTED:
            assert processor(dict(dataset[row], sample_id=row))["input_ids"].numel()
            continue
        kind, named = EXPECTED[row]
        with pytest.raises(SampleError) as info:
            processor(dict(dataset[row], sample_id=row))
        text = str(info.value)
        assert "\n" not in text and f"dataset row {row}: " in text and named in text, text
        if kind != bad_rows.UNREADABLE_IMAGE:
            assert info.value.kind == kind


def test_check_lists_every_broken_sample_by_shard_and_key_and_a_broken_shard_once(broken):
    status, lines, _ = check("--dataset", str(broken))
    assert status == 1
    shards = [line for line in lines if line.startswith("shard-") and " (dataset row " not in line]
    assert shards == [
        f"shard-0001.tar (2 samples, dataset rows 2..3): {bad_rows.MISSING_SHARD}: the shard {broken / 'shard-0001.tar'} does not exist; "
        "its rows are not checked",
        f"shard-0002.tar (1 of its 2 samples, dataset row 5): {bad_rows.TRUNCATED_SHARD}: the shard ends at byte "
        f"{(broken / 'shard-0002.tar').stat().st_size}, inside its sample 1 (counting from 0): it is truncated; its rows are not checked"]
    bad = [line for line in lines if " (dataset row " in line and line.startswith("shard-")]
    by_sample = {row: named for row, named in EXPECTED.items() if row >= 6}  # shards 1 and 2 are said once, above
    assert [int(line.split("(dataset row ")[1].split(")")[0]) for line in bad] == sorted(by_sample)
    for line, (row, (kind, named)) in zip(bad, sorted(by_sample.items())):
        assert line.startswith(f"shard-{row // 2:04d}.tar key {row:06d} (dataset row {row}): {kind}: "), line
        assert named in line, line
    assert f"bad: {len(EXPECTED)} of 12 rows" in lines


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
def test_open_files_stay_bounded_across_eight_times_the_shards_kept_open(tmp_path):
    # 256 shards of one sample read in a shuffled order, twice: nearly every read opens a shard and closes
    # another (an unbounded reader would hold 512 files at the end).
    shards = 8 * OPEN_SHARDS
    folder = write_shards(tmp_path, [{"__key__": f"{i:05d}", "json": b'{"conversations": []}'} for i in range(shards)], 1,
                          "__class__: CrudeWebdataset\n")
    before = _open_files()
    dataset = EnergonDataset(folder)
    order = list(range(shards)) * 2
    random.Random(0).shuffle(order)
    most = 0
    for k in order:
        assert dataset.read(*dataset.locate(k))[0] == f"{k:05d}"
        most = max(most, _open_files() - before)
    assert len(dataset._open) == OPEN_SHARDS and most <= 2 * OPEN_SHARDS + 4  # two files a shard, and Energon's own few
    dataset.close()
    assert _open_files() - before <= 4


# ----------------------------------------------------------------------------------------------------
# Blends


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=5).filter(lambda counts: sum(counts) > 0))
def test_a_blend_lists_its_items_by_position_then_part(counts):
    expected = sorted(((Fraction(2 * j + 1, 2 * c), part, j) for part, c in enumerate(counts) for j in range(c)))
    order = BlendOrder(counts)
    assert [order.locate(k) for k in range(order.total)] == [(part, j) for _, part, j in expected]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(0, 5)), min_size=1, max_size=4).filter(lambda parts: any(w for _, w in parts)))
def test_weighted_counts_show_each_sample_and_follow_the_weights(parts):
    sizes, weights = [n for n, _ in parts], [Fraction(w) for _, w in parts]
    counts = weighted_counts(sizes, weights)
    used = [(n, w, c) for n, w, c in zip(sizes, weights, counts) if w]
    assert all(c >= n for n, _, c in used) and any(c == n for n, _, c in used)  # the scarcest part exactly once
    scale = max(Fraction(n) / w for n, w, _ in used)
    assert all(scale * w <= c < scale * w + 1 for _, w, c in used)
    assert all(c == 0 for w, c in zip(weights, counts) if not w)


def test_a_metadataset_blends_its_datasets_in_one_order(tmp_path, pair):
    small = write_shards(tmp_path / "small", [crude_sample(100 + i) for i in range(3)], 2, "__class__: CrudeWebdataset\n")
    (tmp_path / "blend.yaml").write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        f"      - weight: 3\n        path: {pair[0]}\n      - weight: 1\n        path: small\n")
    blend = open_source(str(tmp_path / "blend.yaml"))
    assert isinstance(blend, EnergonBlend) and len(blend) == SIZE + 8  # 24 samples at 3, so 8 items of 3 samples at 1
    parts = [blend.locate(k) for k in range(len(blend))]
    assert sorted(parts) == sorted([(0, j) for j in range(SIZE)] + [(1, j % 3) for j in range(8)])
    assert parts[:5] == [(0, 0), (0, 1), (1, 0), (0, 2), (0, 3)]  # spread evenly; a tie to the first part
    assert blend[2]["conversations"] == open_source(str(small))[0]["conversations"]
    again = EnergonBlend(tmp_path / "blend.yaml")
    assert [again.locate(k) for k in range(len(blend))] == parts


def test_skip_bad_samples_replaces_an_unreadable_sample_by_the_next_good_one(broken):
    from mimo_pipes.data.bad_rows.skipping import REPLACED_REASONS, REPLACED_ROWS, SkipBadRows
    from mimo_pipes.samples.sample import SAMPLE_ID, SLOT, STEP

    dataset = open_source(str(broken))
    skip = SkipBadRows(load_processor(default_processor_path(), 1024), dataset, micro_batch_size=4, seed=0, dataloader_type="single")
    sample = skip({**dataset[2], SAMPLE_ID: 2, STEP: 0, SLOT: 2})  # rows 2 and 3: the missing shard; then the next global micro-batch
    assert sample[REPLACED_ROWS] == [2, 3] and sample[SAMPLE_ID] == 4
    assert all(reason.startswith(f"shard-0001.tar key 00000{row}: the shard ") for row, reason in zip((2, 3), sample[REPLACED_REASONS]))


def test_an_index_of_another_length_than_info_json_says_is_out_of_date(tmp_path):
    folder = write_shards(tmp_path, [crude_sample(1), crude_sample(3)], 2, "__class__: CrudeWebdataset\n")
    index = folder / "shard-0000.tar.idx"
    index.write_bytes(index.read_bytes()[:-8])
    dataset = open_source(str(folder))
    for row in range(2):
        fault = dataset[row][bad_rows.ROW_FAULT]
        assert fault["kind"] == bad_rows.STALE_INDEX
        assert fault["reason"] == (f"shard-0000.tar key {(1, 3)[row]:06d}: its index holds 1 samples but .info.json says 2: "
                                   "prepare the dataset again")
