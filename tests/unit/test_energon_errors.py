"""Energon inputs that are wrong name their cause once, before any rank starts: a shard that cannot be read
(once, with its samples), a folder never prepared or prepared only in part (with how to prepare it), a
field_map that the first samples do not satisfy (naming dataset.yaml), a metadataset's entry (naming the
file, the entry and what is missing), --image-folder beside an Energon dataset; --split-part reads
another split; every skip reason names the sample's shard and key."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("megatron.energon")  # the energon extra; installed where the tests run

from energon_data import CAPTION_YAML, CRUDE_YAML, VQA_YAML, write_shards  # noqa: E402
from PIL import Image  # noqa: E402

from mimo_pipes.cli.main import main  # noqa: E402
from mimo_pipes.config import PipelineConfig  # noqa: E402
from mimo_pipes.data import bad_rows  # noqa: E402
from mimo_pipes.data.embedded.builtin_processor import default_processor_path  # noqa: E402
from mimo_pipes.data.processing.processor import load_processor  # noqa: E402
from mimo_pipes.data.sources.open_source import open_source  # noqa: E402
from mimo_pipes.errors import ConfigError  # noqa: E402
from mimo_pipes_recipes.vlm_sft import prepare  # noqa: E402

COMMANDS = {  # every command that takes --dataset, with what it needs besides
    "run": ["--steps", "1", "--quiet"],
    "analyze": ["--steps", "1", "--quiet", "--no-plots"],  # no test here looks at the PNGs, the slowest part of a small analysis
    "check": ["--quiet", "--num-workers", "1"],
    "train": ["--steps", "1", "--quiet"],
}


def command(name: str, *argv: str, tmp: Path | None = None) -> tuple[int, str, str]:
    extra = list(COMMANDS[name]) + (["--out", str(tmp / "analysis")] if name == "analyze" and tmp is not None else [])
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main([name, *argv, *extra])
    return status, stdout.getvalue(), stderr.getvalue()


def errors(stderr: str) -> list[str]:
    """The error lines (run and train say the job's first line before their preparation)."""
    return [line for line in stderr.splitlines() if ": error: " in line]


def jpeg(width: int = 64, height: int = 48) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), "green").save(buffer, format="JPEG")
    return buffer.getvalue()


def vqa_samples(count: int, start: int = 0) -> list[dict]:
    return [{"__key__": f"q{i:04d}", "jpg": jpeg(), "json": json.dumps({"question": f"what is {i}?", "answers": [f"it is {i}"]}).encode()}
            for i in range(start, start + count)]


@pytest.fixture(scope="module")
def prepared_vqa(tmp_path_factory) -> Path:
    """The dataset of ``vqa``, written and prepared once for the module (energon's prepare forks a worker)."""
    return write_shards(tmp_path_factory.mktemp("vqa") / "vqa", vqa_samples(40), 8, VQA_YAML)


@pytest.fixture
def vqa(prepared_vqa, tmp_path) -> Path:
    """A VQA dataset of 40 samples in 5 shards of 8: a test's own copy, which it may break."""
    return Path(shutil.copytree(prepared_vqa, tmp_path / "vqa"))


def prepared(dataset: str, **settings) -> list[str]:
    said: list[str] = []
    prepare(PipelineConfig(dataset=dataset, micro_batch_size=4, **settings), log=said.append)
    return said


# ----------------------------------------------------------------------------------------------------
# A shard that cannot be read: once, with its samples, before the ranks start


def test_a_missing_shard_is_refused_once_before_the_ranks_start(vqa):
    (vqa / "shard-0002.tar").unlink()
    status, _, stderr = command("run", "--dataset", str(vqa))
    assert status == 2
    lines = errors(stderr)
    assert len(lines) == 1 and lines[0].count("shard-0002.tar") == 2, stderr  # named once (and its path)
    assert "shard-0002.tar (8 samples, dataset rows 16..23): missing shard: the shard " in lines[0]
    assert "pass --skip-bad-samples" in lines[0]


def test_with_skip_bad_samples_each_broken_shard_is_said_once_at_the_start(vqa):
    (vqa / "shard-0001.tar").unlink()
    (vqa / "shard-0003.tar.idx").unlink()  # another missing piece of a shard: its index
    said = [line for line in prepared(str(vqa), skip_bad_samples=True) if "--skip-bad-samples" in line]
    assert len(said) == 2
    assert said[0].startswith("--dataset: shard-0001.tar (8 samples, dataset rows 8..15): missing shard: ")
    assert said[1].startswith("--dataset: shard-0003.tar (8 samples, dataset rows 24..31): index out of date: the shard has no index")


def test_check_says_a_shard_without_its_index_once(vqa):
    (vqa / "shard-0004.tar.idx").unlink()
    status, stdout, _ = command("check", "--dataset", str(vqa))
    assert status == 1
    lines = [line for line in stdout.splitlines() if "shard-0004" in line]
    assert lines == [f"shard-0004.tar (8 samples, dataset rows 32..39): {bad_rows.STALE_INDEX}: the shard has no index "
                     "(shard-0004.tar.idx): prepare the dataset again; its rows are not checked"]
    assert "bad: 8 of 40 rows" in stdout


def test_a_missing_shard_of_a_blend_is_named_once_with_its_dataset(vqa, tmp_path):
    (vqa / "shard-0000.tar").unlink()
    captions = write_shards(tmp_path / "cap", [{"__key__": f"c{i}", "jpg": jpeg(), "txt": b"a picture"} for i in range(4)], 4, CAPTION_YAML)
    blend = tmp_path / "blend.yaml"
    blend.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
                     f"      - weight: 3\n        path: {vqa}\n      - weight: 1\n        path: {captions}\n")
    with pytest.raises(ConfigError, match=rf"dataset: .*1 shard\(s\) cannot be read \(8 rows\): {vqa}: shard-0000.tar \(8 samples, "
                                          r"dataset rows 0..7\); 8 rows of the blend: missing shard"):
        prepared(str(blend))
    status, stdout, _ = command("check", "--dataset", str(blend))
    assert status == 1 and stdout.count("shard-0000.tar") == 2 and "bad: 8 of 54 rows" in stdout  # 40 + ceil(40/3) = 14


# ----------------------------------------------------------------------------------------------------
# Not prepared, or prepared in part


def test_a_folder_of_tars_without_nv_meta_is_an_energon_dataset_not_prepared(vqa):
    shutil.rmtree(vqa / ".nv-meta")
    for name in ("check", "run"):
        status, _, stderr = command(name, "--dataset", str(vqa))
        assert status == 2
        assert errors(stderr) == [f"mimo-pipes {name}: error: --dataset: {str(vqa)!r} holds 5 tar shard(s) (shard-0000.tar, ...) but no "
                                  f".nv-meta/ folder: an Energon dataset that was not prepared; prepare it with Energon: energon prepare {vqa}"]


@pytest.mark.parametrize("piece", ["dataset.yaml", "split.yaml", ".info.json"])
def test_a_dataset_prepared_in_part_names_the_missing_piece(vqa, piece):
    (vqa / ".nv-meta" / piece).unlink()
    with pytest.raises(ConfigError, match=rf"dataset: .* is an Energon dataset that was not prepared to the end: \.nv-meta/ has no "
                                          rf"{piece} .*; prepare it with Energon: energon prepare {vqa}$"):
        open_source(str(vqa))


def test_a_split_yaml_naming_a_shard_info_json_does_not_count_is_named(vqa):
    split = vqa / ".nv-meta" / "split.yaml"
    split.write_text(json.dumps({"split_parts": {"train": ["shard-0000.tar", "shard-0009.tar"]}, "exclude": []}))
    with pytest.raises(ConfigError, match=r"lists the shard 'shard-0009.tar' in its 'train' split, but .nv-meta/.info.json has no count"):
        open_source(str(vqa))


# ----------------------------------------------------------------------------------------------------
# dataset.yaml against the first samples


@pytest.mark.parametrize(("field_map", "field", "spec"), [
    ("image: jpg\n  context: json[prompt]\n  answers: json[answers]\n", "context", "json[prompt]"),
    ("image: png\n  context: json[question]\n  answers: json[answers]\n", "image", "png"),
    ("image: jpg\n  context: json[question]\n  answers: txt,json[replies]\n", "answers", "txt,json[replies]"),
])
def test_a_field_map_no_sample_satisfies_is_refused_before_the_ranks_start_naming_dataset_yaml(vqa, field_map, field, spec):
    (vqa / ".nv-meta" / "dataset.yaml").write_text(VQA_YAML.split("field_map:")[0] + "field_map:\n  " + field_map)
    status, _, stderr = command("run", "--dataset", str(vqa))
    assert status == 2 and len(errors(stderr)) == 1, stderr
    assert f"--dataset: {vqa / '.nv-meta' / 'dataset.yaml'}: the field_map maps {field} to {spec!r}, which none of the first 8 samples " \
           "of shard-0000.tar (keys q0000, q0001, q0002, ...) has (their parts: jpg, json;" in stderr
    status, _, stderr = command("check", "--dataset", str(vqa))
    assert status == 2 and "dataset.yaml: the field_map maps" in stderr


def test_a_crude_dataset_whose_first_samples_make_no_conversation_is_refused_naming_dataset_yaml(tmp_path):
    folder = write_shards(tmp_path / "crude", [{"__key__": f"{i}", "txt": b"hello"} for i in range(6)], 3, CRUDE_YAML)
    with pytest.raises(ConfigError, match=r"dataset.yaml: none of the first 3 samples of shard-0000.tar .* fits it: a crude sample needs a json part"):
        prepared(str(folder))


def test_a_field_only_some_first_samples_lack_is_their_fault_not_the_field_maps(tmp_path):
    samples = vqa_samples(8)
    del samples[0]["json"]  # one bad sample: a bad row, the dataset is fine
    folder = write_shards(tmp_path / "vqa", samples, 8, VQA_YAML)
    prepared(str(folder), skip_bad_samples=True)
    assert bad_rows.ROW_FAULT in open_source(str(folder))[0]


# ----------------------------------------------------------------------------------------------------
# Metadatasets: the file, the entry, what is missing


def metadataset(tmp_path: Path, entries: str, name: str = "blend.yaml", splits: str = "train") -> Path:
    path = tmp_path / name
    path.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  {splits}:\n    blend:\n{entries}")
    return path


def test_a_metadataset_entry_naming_no_path_says_it_does_not_exist(vqa, tmp_path):
    blend = metadataset(tmp_path, f"      - weight: 1\n        path: {vqa}\n      - weight: 1\n        path: nowhere\n")
    status, _, stderr = command("check", "--dataset", str(blend))
    assert status == 2
    assert stderr.strip() == (f"mimo-pipes check: error: --dataset: {blend}: splits.train.blend[1] (path nowhere) names "
                              f"{tmp_path / 'nowhere'}, which does not exist")


def test_a_split_part_a_metadataset_entry_lacks_names_the_metadataset_and_the_entry(vqa, tmp_path):
    blend = metadataset(tmp_path, f"      - weight: 1\n        path: {vqa}\n        split_part: val\n")
    with pytest.raises(ConfigError) as info:
        open_source(str(blend))
    assert str(info.value) == (f"dataset: {blend}: splits.train.blend[0] (path {vqa}), split_part 'val': {str(vqa)!r} has no 'val' "
                               "split: its .nv-meta/split.yaml has train")
    assert "prepare" not in str(info.value)


def test_a_nested_metadataset_entry_is_named_through_the_outer_one(vqa, tmp_path):
    inner = metadataset(tmp_path, f"      - weight: 1\n        path: {vqa}\n      - weight: 2\n        path: gone\n", name="inner.yaml")
    outer = metadataset(tmp_path, f"      - weight: 1\n        path: {vqa}\n      - weight: 1\n        path: inner.yaml\n", name="outer.yaml")
    (tmp_path / "gone").mkdir()
    (tmp_path / "gone" / "shard-0.tar").write_bytes(b"")
    with pytest.raises(ConfigError) as info:
        open_source(str(outer))
    assert str(info.value).startswith(f"dataset: {outer}: splits.train.blend[1] (path inner.yaml): {inner}: splits.train.blend[1] "
                                      f"(path gone): {str(tmp_path / 'gone')!r} holds 1 tar shard(s) (shard-0.tar) but no .nv-meta/")
    assert str(info.value).endswith(f"energon prepare {tmp_path / 'gone'}")


def test_a_split_a_metadataset_lacks_is_named_with_the_ones_it_has(vqa, tmp_path):
    blend = metadataset(tmp_path, f"      - weight: 1\n        path: {vqa}\n")
    with pytest.raises(ConfigError, match=rf"^split_part: the metadataset {blend} has no 'test' split: its splits are train$"):
        open_source(str(blend), "test")


# ----------------------------------------------------------------------------------------------------
# --image-folder does not apply


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_image_folder_beside_an_energon_dataset_is_refused_in_one_line(vqa, tmp_path, name):
    status, stdout, stderr = command(name, "--dataset", str(vqa), "--image-folder", str(tmp_path), tmp=tmp_path)
    assert status == 2 and stdout == ""
    assert stderr.strip() == (f"mimo-pipes {name}: error: --image-folder: does not apply to an Energon --dataset ({vqa}): its images "
                              "are read from its shards; leave --image-folder out")


def test_check_does_not_say_image_paths_resolve_in_an_energon_dataset(vqa):
    status, stdout, _ = command("check", "--dataset", str(vqa))
    assert status == 0
    assert "resolve inside" not in stdout and "images read from its shards" in stdout.splitlines()[0]


# ----------------------------------------------------------------------------------------------------
# --split-part


@pytest.fixture
def three_splits(tmp_path) -> Path:
    """30 VQA samples in 6 shards of 5: train = shards 0, 1, 2; val = shards 4, 3 (in that order); test = shard 5."""
    names = [f"shard-{k:04d}.tar" for k in range(6)]
    return write_shards(tmp_path / "splits", vqa_samples(30), 5, VQA_YAML,
                        splits={"train": names[:3], "val": [names[4], names[3]], "test": [names[5]]})


def questions(dataset) -> list[str]:
    return [dataset[k]["messages"][0]["content"][1]["text"] for k in range(len(dataset))]


def test_split_part_k_is_the_kth_sample_of_that_parts_shards_in_split_yaml_order(three_splits):
    assert questions(open_source(str(three_splits))) == [f"what is {i}?" for i in range(15)]
    assert questions(open_source(str(three_splits), "val")) == [f"what is {i}?" for i in [*range(20, 25), *range(15, 20)]]
    assert questions(open_source(str(three_splits), "test")) == [f"what is {i}?" for i in range(25, 30)]


def test_split_part_of_a_metadataset_reads_that_split_of_each_dataset(three_splits, tmp_path):
    blend = tmp_path / "blend.yaml"
    blend.write_text(f"__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: {three_splits}\n"
                     f"  val:\n    blend:\n      - weight: 1\n        path: {three_splits}\n")
    assert questions(open_source(str(blend), "val")) == questions(open_source(str(three_splits), "val"))


def test_check_and_analyze_read_the_split_part_they_are_given(three_splits, tmp_path):
    status, stdout, _ = command("check", "--dataset", str(three_splits), "--split-part", "val")
    assert status == 0 and stdout.startswith(f"mimo-pipes check: {three_splits}: 10 rows;") and "split part 'val'" in stdout
    val_only = write_shards(tmp_path / "val-only", [*vqa_samples(5, 20), *vqa_samples(5, 15)], 5, VQA_YAML)
    flags = ["--micro-batch-size", "4", "--steps", "2", "--scalable-dp", "--intra-microbatch-reorder", "--dataloader-type", "single"]
    analyses = []
    for source in (["--dataset", str(three_splits), "--split-part", "val"], ["--dataset", str(val_only)]):
        out = tmp_path / f"analysis-{len(analyses)}"
        status, _, stderr = command("analyze", *flags, *source, "--out", str(out))
        assert status == 0, stderr
        analyses.append({module: figures for module, figures in json.loads((out / "analysis.json").read_text()).items()
                         if module in ("language", "images")})
    assert analyses[0] == analyses[1] and set(analyses[0]) == {"language", "images"}


@pytest.mark.parametrize("name", ["run", "check", "analyze"])
def test_a_split_part_the_dataset_lacks_is_refused_naming_the_ones_it_has(vqa, name, tmp_path):
    status, _, stderr = command(name, "--dataset", str(vqa), "--split-part", "val", tmp=tmp_path)
    assert status == 2
    assert errors(stderr) == [f"mimo-pipes {name}: error: --split-part: {str(vqa)!r} has no 'val' split: its .nv-meta/split.yaml has train"]


def test_a_split_part_other_than_train_needs_an_energon_source(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "hi", "response": "there"}) + "\n")
    status, _, stderr = command("check", "--dataset", str(rows), "--split-part", "val")
    assert status == 2 and stderr.strip() == (f"mimo-pipes check: error: --split-part: 'val' is a split of a Megatron-Energon dataset or "
                                              f"metadataset; --dataset {rows} is not one (it is read whole, as train)")


# ----------------------------------------------------------------------------------------------------
# Skip reasons name shard and key, on every path


def cut_images(tmp_path: Path) -> Path:
    """12 VQA samples, 4 a shard: sample 2's JPEG cut inside its header, sample 5's after it, sample 9's reply empty."""
    samples = vqa_samples(12)
    whole = samples[2]["jpg"]
    samples[2]["jpg"] = whole[:60]
    samples[5]["jpg"] = whole[: len(whole) * 2 // 3]
    samples[9]["json"] = json.dumps({"question": "what?", "answers": [""]}).encode()
    return write_shards(tmp_path / "cut", samples, 4, VQA_YAML)


@pytest.mark.parametrize("payload", ["samples", "rows"])
def test_every_skip_reason_names_shard_and_key(tmp_path, payload):
    from mimo_pipes.data.bad_rows.skipping import REPLACED_REASONS, REPLACED_ROWS, SkipBadRows
    from mimo_pipes.data.processing.row_counter import RowCounter
    from mimo_pipes.samples.module_fields import module_fields
    from mimo_pipes.samples.sample import SAMPLE_ID, SLOT, STEP

    dataset = open_source(str(cut_images(tmp_path)))
    processor = load_processor(default_processor_path(), 512)
    process = processor if payload == "samples" else RowCounter(processor, module_fields("images"), whole_files=True).count
    skip = SkipBadRows(process, dataset, micro_batch_size=12, seed=0, dataloader_type="single")
    reasons = {}
    for row in (2, 5, 9):
        sample = skip({**dataset[row], SAMPLE_ID: row, STEP: 0, SLOT: 0})
        reasons.update(zip(sample[REPLACED_ROWS], sample[REPLACED_REASONS]))
    assert sorted(reasons) == [2, 5, 9]
    for row, reason in reasons.items():
        assert reason.startswith(f"shard-{row // 4:04d}.tar key q{row:04d}: "), reason
        assert reason.count(f"key q{row:04d}") == 1


def test_analyze_and_the_masking_path_name_shard_and_key_too(tmp_path):
    from mimo_pipes.analysis.row_counts import count_rows
    from mimo_pipes.data.processing.module_processor import ModuleProcessor
    from mimo_pipes.data.processing.row_counter import RowCounter
    from mimo_pipes.errors import SampleError
    from mimo_pipes.samples.module_fields import ENCODER, ModuleFields

    dataset = open_source(str(cut_images(tmp_path)))
    processor = load_processor(default_processor_path(), 512)
    counted = count_rows(dataset, processor, skip_bad=True, whole_files=True)
    assert sorted(counted.bad_rows) == [2, 5, 9]
    assert all(why.startswith(f"shard-{row // 4:04d}.tar key q{row:04d}: ") for row, why in counted.bad_rows.items())
    encoder = ModuleProcessor(processor, ModuleFields(ENCODER))
    with pytest.raises(SampleError, match=r"dataset row 5: shard-0001.tar key q0005: image 0 "):  # counted, then processed after the exchange
        encoder(RowCounter(processor, ModuleFields(ENCODER)).count({**dataset[5], "sample_id": 5}))


@pytest.mark.parametrize(("text", "said"), [
    ("", "is not an Energon metadataset: it has no splits"),
    ("foo: 1\n", "is not an Energon metadataset: it has no splits"),
    ("splits: [\n", "cannot read {path} (a metadataset): while parsing"),
    ("__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n      - weight: -1\n        path: {vqa}\n",
     "{path}: splits.train.blend: weights must be >= 0 and not all 0"),
])
def test_a_yaml_that_is_no_metadataset_is_named_in_one_line(vqa, tmp_path, capfd, text, said):
    path = tmp_path / "m.yaml"
    path.write_text(text.format(vqa=vqa))
    with pytest.raises(ConfigError) as info:
        open_source(str(path))
    assert said.format(path=path) in str(info.value) and "\n" not in str(info.value)
    assert capfd.readouterr().err == ""  # no parser's own lines on the terminal


def test_a_file_or_folder_inside_nv_meta_points_to_the_dataset(vqa):
    for inside in (vqa / ".nv-meta", vqa / ".nv-meta" / "dataset.yaml"):
        status, _, stderr = command("check", "--dataset", str(inside))
        assert status == 2 and "of an Energon dataset" in stderr and stderr.rstrip().endswith(f"pass the dataset's folder, {vqa}")


def test_a_shard_that_is_a_folder_is_said_once_like_a_missing_one(vqa):
    (vqa / "shard-0001.tar").unlink()
    (vqa / "shard-0001.tar").mkdir()
    status, stdout, _ = command("check", "--dataset", str(vqa))
    assert status == 1
    assert [line for line in stdout.splitlines() if "shard-0001" in line] == [
        f"shard-0001.tar (8 samples, dataset rows 8..15): {bad_rows.MISSING_SHARD}: the shard {vqa / 'shard-0001.tar'} is not a file; "
        "its rows are not checked"]
