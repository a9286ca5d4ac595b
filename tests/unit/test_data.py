"""The embedded synthetic dataset, the offline processor and the per-sample processing contract."""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mimo_pipes.data.cache import build_atomically
from mimo_pipes.data.embedded import synthetic
from mimo_pipes.data.embedded.builtin_dataset import default_dataset_path
from mimo_pipes.data.embedded.builtin_processor import IMAGE_PAD, SPECIAL_TOKENS, build_default_processor
from mimo_pipes.data.processing.processor import TRUNCATED, SampleProcessor, check_processor_path, load_processor
from mimo_pipes.data.sources.open_source import open_source
from mimo_pipes.data.sources.saved_folder import check_dataset_path, open_dataset
from mimo_pipes.errors import ConfigError, SampleError
from mimo_pipes.observe.warning_tally import collected, counts
from mimo_pipes.samples.cost import image_token_count

N_SMALL = 40


@pytest.fixture(scope="session")
def processor_dir(tmp_path_factory) -> Path:
    return build_default_processor(tmp_path_factory.mktemp("processor"))


@pytest.fixture(scope="session")
def small_dataset_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "ds"
    synthetic.generate_synthetic_dataset(path, N_SMALL, seed=0)
    return path


@pytest.fixture(scope="session")
def small_dataset(small_dataset_dir):
    return datasets.load_from_disk(str(small_dataset_dir))


@pytest.fixture(scope="session")
def proc(processor_dir) -> SampleProcessor:
    return load_processor(processor_dir, 4096)


def _row(images, prompt="Describe this.", response="A picture of a tree.", sample_id=7, **extra):
    return {"sample_id": sample_id, "images": images, "prompt": prompt, "response": response, **extra}


def _png(w, h, color=(10, 120, 200)) -> Image.Image:
    return Image.new("RGB", (w, h), color)


def _vision_groups(input_ids: torch.Tensor, proc: SampleProcessor) -> list[int]:
    """Placeholder count between each vision_start/vision_end pair, checking they are contiguous."""
    ids = input_ids.tolist()
    groups = []
    k = 0
    while k < len(ids):
        if ids[k] == proc.vision_start_id:
            end = ids.index(proc.vision_end_id, k)
            inner = ids[k + 1 : end]
            assert all(t == proc.image_token_id for t in inner), "placeholders not contiguous"
            groups.append(len(inner))
            k = end
        k += 1
    assert len(groups) == ids.count(proc.vision_end_id)
    return groups


# --------------------------------------------------------------------------------------------------
# Processor: placeholder expansion


@pytest.fixture(scope="module")
def processed(proc, small_dataset) -> list[dict]:
    """Each small_dataset row through ``proc`` once, on this thread: what the tests below compare with."""
    return [proc(dict(small_dataset[i], sample_id=i)) for i in range(len(small_dataset))]


def test_placeholders_match_grid_on_every_kind(proc, small_dataset, processed):
    seen_kinds = set()
    for i in range(len(small_dataset)):
        row = dict(small_dataset[i], sample_id=i)
        n_images = len(row["images"])
        out = dict(processed[i])
        if n_images == 0:  # a text-only sample carries no vision field
            out.update(image_grid_thw=torch.zeros(0, 3, dtype=torch.int64), pixel_values=torch.zeros(0, 1176))
        grid = out["image_grid_thw"]
        assert grid.dtype == torch.int64 and grid.shape == (n_images, 3)
        per_image = (grid.prod(dim=1) // proc.merge_size**2).tolist()
        assert (grid.prod(dim=1) % proc.merge_size**2 == 0).all()
        assert image_token_count(out["input_ids"], proc.image_token_id) == sum(per_image)
        assert _vision_groups(out["input_ids"], proc) == per_image
        assert out["pixel_values"].dtype == torch.float32
        assert out["pixel_values"].shape == (int(grid.prod(dim=1).sum()), 3 * 2 * 14 * 14)
        if row["kind"] == "text":
            assert n_images == 0 and sum(per_image) == 0
            assert out["pixel_values"].shape == (0, 1176) and grid.shape == (0, 3)
        else:
            assert n_images >= 1 and all(n >= 4 for n in per_image)
        seen_kinds.add(row["kind"])
    assert seen_kinds == set(synthetic.KINDS)


def test_multi_image_groups_in_order(proc):
    # 56x56 -> 2x2 merged tokens = 4; 280x140 -> 10x5 = 50; 560x560 -> 20x20 = 400
    row = _row([_png(56, 56), _png(280, 140), _png(560, 560)])
    out = proc(row)
    assert out["image_grid_thw"].tolist() == [[1, 4, 4], [1, 10, 20], [1, 40, 40]]
    assert _vision_groups(out["input_ids"], proc) == [4, 50, 400]
    assert out["pixel_values"].shape[0] == 16 + 200 + 1600
    # The images come before the prompt, inside the user turn.
    first_text = out["input_ids"].tolist().index(proc.vision_end_id)
    assert first_text < out["input_ids"].tolist().index(proc.im_end_id)


def test_text_only_has_no_image_fields(proc):
    for images in (None, []):
        out = proc(_row(images))
        assert image_token_count(out["input_ids"], proc.image_token_id) == 0
        assert "pixel_values" not in out and "image_grid_thw" not in out  # collation adds empty ones
        assert proc.vision_start_id not in out["input_ids"].tolist()


def test_labels_masks_and_positions(proc, processor_dir):
    from transformers import AutoTokenizer

    response = "The total is 12.50 on the receipt."
    out = proc(_row([_png(100, 200)], response=response))
    ids, labels, mask = out["input_ids"], out["labels"], out["loss_mask"]
    n = ids.shape[0]
    for key in ("input_ids", "attention_mask", "labels", "position_ids"):
        assert out[key].dtype == torch.int64 and out[key].shape == (n,)
    assert out["loss_mask"].dtype == torch.float32 and out["loss_mask"].shape == (n,)
    assert torch.equal(out["attention_mask"], torch.ones(n, dtype=torch.int64))
    assert torch.equal(out["position_ids"], torch.arange(n))
    assert torch.equal(mask, (labels != -100).float())
    trained = labels != -100
    assert torch.equal(labels[trained], ids[1:][trained[:-1]])
    assert labels[-1] == -100
    tok = AutoTokenizer.from_pretrained(str(processor_dir))
    assert tok.decode(labels[trained].tolist()) == response + "<|im_end|>"
    # Nothing of the prompt or the images is trained.
    assert not trained[: ids.tolist().index(proc.vision_end_id) + 1].any()


def test_passthrough_keys(proc):
    row = _row([_png(60, 60)], sample_id=11, id=3, kind="photo", step=5, anything={"x": 1})
    out = proc(row)
    for key in ("images", "prompt", "response"):
        assert key not in out
    assert out["sample_id"] == 11 and out["id"] == 3 and out["kind"] == "photo" and out["step"] == 5
    assert out["anything"] is row["anything"]


def test_accepts_undecoded_images(processor_dir, tmp_path):
    proc = load_processor(processor_dir, 4096, image_folder=str(tmp_path))
    img = _png(120, 90)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    file = tmp_path / "a.png"
    img.save(file)
    expected = proc(_row([img]))["input_ids"]
    for form in ({"bytes": buf.getvalue(), "path": None}, buf.getvalue(), str(file), "a.png", np.asarray(img), img):
        assert torch.equal(proc(_row([form]))["input_ids"], expected)
    assert torch.equal(proc(_row(img))["input_ids"], expected)  # a single image, not a list


# --------------------------------------------------------------------------------------------------
# Processor: sequence length


def test_truncation_keeps_image_tokens_and_warns(processor_dir, caplog):
    full = load_processor(processor_dir, 4096)
    long_text = " ".join(["total amount paid by card"] * 60)
    row = _row([_png(280, 280), _png(56, 112)], prompt=long_text, response=long_text, sample_id="rx-42")
    untruncated = full(row)
    image_tokens = image_token_count(untruncated["input_ids"], full.image_token_id)
    assert image_tokens == 100 + 8
    seq_length = image_tokens + 40
    assert untruncated["input_ids"].shape[0] > seq_length
    short = load_processor(processor_dir, seq_length)
    with collected() as tally:
        out = short(row)
    assert out["input_ids"].shape[0] == seq_length
    assert image_token_count(out["input_ids"], short.image_token_id) == image_tokens
    assert torch.equal(out["image_grid_thw"], untruncated["image_grid_thw"])
    assert torch.equal(out["pixel_values"], untruncated["pixel_values"])
    assert out["labels"][-1] == -100  # the text past --seq-length is cut at the end
    assert tally.snapshot() == {TRUNCATED: ["rx-42"]}  # counted once, said in the job's summary
    with collected():
        pass  # a fresh tally, not collected after this block: the first truncation of a process is logged, once
    with caplog.at_level(logging.WARNING, logger="mimo_pipes"):
        short(row)
        short({**row, "sample_id": "rx-43"})
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [f"dataset row rx-42: truncated from {untruncated['input_ids'].shape[0]} "
                                                                     f"to --seq-length {seq_length} tokens"]
    assert [count.line() for count in counts()] == [
        "warnings: 2 samples truncated to --seq-length (later turns first, then the prompt's start and the reply's end; "
        "every image placeholder kept; first: dataset row rx-42)"]


def test_no_warning_without_truncation(proc, caplog):
    with collected() as tally, caplog.at_level(logging.WARNING, logger="mimo_pipes"):
        proc(_row([_png(60, 60)]))
    assert not caplog.records and tally.snapshot() == {}


def test_images_that_cannot_fit_raise_sample_error(processor_dir):
    proc = load_processor(processor_dir, 300)
    row = _row([_png(560, 560)], sample_id=1234)  # 400 image tokens
    with pytest.raises(SampleError) as info:
        proc(row)
    err = info.value
    assert err.sample_id == 1234 and err.field == "images"
    assert "1234" in str(err) and "--seq-length 300" in str(err)
    needed = 400 + 2 + 1  # placeholders, vision start and end, and one token to train on
    assert f"needs {needed} tokens" in str(err) and "dataset row 1234" in str(err)
    # Exactly that fits: the images whole, one reply token trained, the prompt's text given way.
    out = load_processor(processor_dir, needed)(row)
    assert out["input_ids"].shape[0] == needed and int((out["labels"] != -100).sum()) == 1
    assert image_token_count(out["input_ids"], proc.image_token_id) == 400
    with pytest.raises(SampleError, match="needs 403 tokens"):
        load_processor(processor_dir, needed - 1)(row)


LONG = " ".join(["total amount paid by card"] * 60)
IMAGE_AND_MARKERS = 4 + 2  # a 56 x 56 picture: 4 placeholders between vision start and end


def _parts(out, proc):
    """(fixed, prompt, reply) tokens of a processed sample: images and their markers, untrained text, trained text."""
    ids = out["input_ids"].tolist()
    fixed = {proc.image_token_id, proc.vision_start_id, proc.vision_end_id}
    reply = [t for t, label in zip(ids[1:], out["labels"].tolist()) if label != -100]
    prompt = [t for t in ids if t not in fixed]
    return [t for t in ids if t in fixed], prompt[: len(prompt) - len(reply)], reply


@pytest.mark.parametrize("seq_length", [60, 200])
def test_a_long_prompt_gives_way_to_a_short_reply(processor_dir, seq_length):
    row = _row([_png(56, 56)], prompt=LONG, response="A picture of a tree.")
    full = load_processor(processor_dir, 4096)(row)
    proc = load_processor(processor_dir, seq_length)
    out = proc(row)
    fixed, prompt, reply = _parts(out, proc)
    full_fixed, full_prompt, full_reply = _parts(full, proc)
    assert out["input_ids"].shape[0] == seq_length
    assert fixed == full_fixed and reply == full_reply  # images whole, the reply whole and trained
    assert prompt == full_prompt[len(full_prompt) - len(prompt):]  # the prompt lost its beginning
    assert out["input_ids"][IMAGE_AND_MARKERS:].tolist() == full["input_ids"][-(seq_length - IMAGE_AND_MARKERS):].tolist()


def test_a_short_prompt_is_kept_and_a_long_reply_cut_at_its_end(processor_dir):
    row = _row([_png(56, 56)], prompt="Describe this.", response=LONG)
    full = load_processor(processor_dir, 4096)(row)
    out = load_processor(processor_dir, 80)(row)
    assert out["input_ids"].tolist() == full["input_ids"][:80].tolist()
    assert out["labels"][:-1].tolist() == full["labels"][:79].tolist()


@pytest.mark.parametrize("room", [100, 101])
def test_a_long_prompt_and_a_long_reply_keep_half_of_the_room_each(processor_dir, room):
    row = _row([_png(56, 56)], prompt=LONG, response=LONG)
    proc = load_processor(processor_dir, IMAGE_AND_MARKERS + room)
    fixed, prompt, reply = _parts(proc(row), proc)
    assert len(fixed) == IMAGE_AND_MARKERS
    assert (len(prompt), len(reply)) == (room // 2, room - room // 2)


def test_later_turns_give_way_before_the_first_exchange(processor_dir):
    turns = [{"role": "user", "content": LONG}, {"role": "assistant", "content": "First answer."},
             {"role": "user", "content": "And then?"}, {"role": "assistant", "content": "Second answer."}]
    row = {"sample_id": 8, "images": [_png(56, 56)], "messages": turns}
    proc = load_processor(processor_dir, 120)
    first = load_processor(processor_dir, 4096)({**row, "messages": turns[:2]})
    _, prompt, reply = _parts(proc(row), proc)
    _, first_prompt, first_reply = _parts(first, proc)
    assert reply == first_reply  # the first reply whole; nothing of the second turn left
    assert prompt == first_prompt[len(first_prompt) - len(prompt):]
    assert proc(row)["input_ids"].shape[0] == 120


def test_a_sample_left_with_no_trained_token_is_a_bad_sample(processor_dir):
    from transformers import AutoImageProcessor, AutoTokenizer

    tokenizer, images = AutoTokenizer.from_pretrained(str(processor_dir)), AutoImageProcessor.from_pretrained(str(processor_dir))
    drops_replies = "{% for m in messages %}{% if m.role != 'assistant' %}<|im_start|>{{ m.content }}<|im_end|>{% endif %}{% endfor %}"
    proc = SampleProcessor(tokenizer, images, 256, chat_template=drops_replies)
    with pytest.raises(SampleError, match="dataset row 7: no token to train on") as info:
        proc(_row([]))
    assert info.value.sample_id == 7


def test_bad_rows_raise_sample_error(proc):
    with pytest.raises(SampleError) as info:
        proc(_row([b"not an image"], sample_id=5))
    assert info.value.sample_id == 5 and info.value.field == "images"
    with pytest.raises(SampleError) as info:
        proc({"sample_id": 6, "images": [], "prompt": "hi"})
    assert info.value.field == "messages" and "no assistant text" in str(info.value)
    with pytest.raises(SampleError):
        proc(_row([], prompt=3))


def test_bad_seq_length(processor_dir):
    from mimo_pipes.config.flags import flag_names

    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(ConfigError) as info:
            load_processor(processor_dir, bad)
        assert info.value.setting == "seq_length"  # in Python the argument; in a command its flag
        with pytest.raises(ConfigError) as info, flag_names():
            load_processor(processor_dir, bad)
        assert info.value.setting == "--seq-length"


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300) | st.lists(st.sampled_from([*SPECIAL_TOKENS, " ", "word", "42", "\n", "é"]), max_size=40).map("".join))
def test_text_is_tokenized_as_the_tokenizer_encodes_it(proc, text):
    # _encode lets the GIL go (encode_batch) where encode holds it: the tokens must stay encode's, special tokens too
    assert proc._encode(text) == proc._tokenizer.encode(text, add_special_tokens=False).ids


def test_count_image_tokens():
    ids = [1, 5, 5, 2, 5]
    assert image_token_count(ids, 5) == 3
    assert image_token_count(torch.tensor([ids, ids]), 5) == 6
    assert image_token_count(np.array(ids), 9) == 0


def test_sample_processor_is_picklable(proc, small_dataset):
    clone = pickle.loads(pickle.dumps(proc))
    assert clone.image_token_id == proc.image_token_id and clone.seq_length == proc.seq_length
    row = dict(small_dataset[0], sample_id=0)
    a, b = proc(row), clone(dict(row))
    for key in ("input_ids", "labels", "loss_mask", "pixel_values", "image_grid_thw"):
        assert torch.equal(a[key], b[key])


def test_thread_safe(proc, small_dataset, processed):
    rows = [dict(small_dataset[i], sample_id=i) for i in range(8)]
    expected = [out["input_ids"] for out in processed[:8]]
    results = [None] * len(rows)

    def work(i):
        results[i] = proc(rows[i])["input_ids"]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(rows))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(a, b) for a, b in zip(results, expected))


# --------------------------------------------------------------------------------------------------
# Saved processor


def test_processor_reloads_with_auto_classes(processor_dir):
    from transformers import AutoImageProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(processor_dir))
    assert tok.pad_token == "<|endoftext|>"
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.convert_tokens_to_ids(IMAGE_PAD)) == 1
    assert tok.decode(ids) == text

    ip = AutoImageProcessor.from_pretrained(str(processor_dir), backend="pil")
    assert type(ip).__name__ == "Qwen2VLImageProcessorPil"
    assert (ip.patch_size, ip.temporal_patch_size, ip.merge_size) == (14, 2, 2)
    cfg = json.loads((processor_dir / "preprocessor_config.json").read_text())
    assert cfg["size"] == {"shortest_edge": 56 * 56, "longest_edge": 1280 * 28 * 28}
    feats = ip(images=[_png(2000, 3000)], return_tensors="np")
    assert int(np.prod(feats["image_grid_thw"][0])) // 4 <= 1280


@pytest.mark.launch  # a fresh interpreter builds the processor
def test_default_processor_is_deterministic_across_processes(processor_dir, tmp_path):
    """Every host builds the same tokenizer, so all modules count the same tokens."""
    env = dict(os.environ, MIMO_PIPES_CACHE=str(tmp_path / "cache"))
    code = "from mimo_pipes.data.embedded.builtin_processor import default_processor_path as d; print(d())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    built = Path(out.stdout.strip().splitlines()[-1])
    assert built == tmp_path / "cache" / "processor-v2"
    for name in ("tokenizer.json", "preprocessor_config.json"):
        assert (built / name).read_bytes() == (processor_dir / name).read_bytes()
    assert [p.name for p in built.parent.iterdir()] == ["processor-v2"]  # no temporary folder left


# --------------------------------------------------------------------------------------------------
# Cache


def test_build_atomically_race(tmp_path):
    final = tmp_path / "artifact"
    calls = []

    def build(tmp: Path):
        calls.append(tmp)
        (tmp / "payload.txt").write_text("same")
        time.sleep(0.05)

    results = []
    threads = [threading.Thread(target=lambda: results.append(build_atomically(final, build))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [final] * 4
    assert (final / "payload.txt").read_text() == "same"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]
    n = len(calls)
    assert build_atomically(final, build) == final and len(calls) == n  # cached: no rebuild


def test_build_atomically_tolerates_other_winner_and_reports_failure(tmp_path):
    final = tmp_path / "artifact"

    def build_while_other_wins(tmp: Path):
        (tmp / "mine").write_text("x")
        final.mkdir()
        (final / "theirs").write_text("y")

    assert build_atomically(final, build_while_other_wins) == final
    assert sorted(p.name for p in final.iterdir()) == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == ["artifact"]

    def broken(tmp: Path):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_atomically(tmp_path / "other", broken)
    assert [p.name for p in tmp_path.iterdir()] == ["artifact"]


def test_default_dataset_path_builds_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MIMO_PIPES_CACHE", str(tmp_path / "c"))
    path = default_dataset_path(12, seed=3)
    assert path == tmp_path / "c" / "dataset-v1-n12-s3"
    stamp = (path / "state.json").stat().st_mtime_ns
    assert default_dataset_path(12, seed=3) == path
    assert (path / "state.json").stat().st_mtime_ns == stamp
    ds = open_dataset(path)
    assert ds["id"] == list(range(12))


# --------------------------------------------------------------------------------------------------
# Synthetic dataset


def _sizes(ds) -> list[list[tuple[int, int]]]:
    return [[im.size for im in row["images"]] for row in ds]


def test_dataset_round_trip_and_determinism(small_dataset_dir, small_dataset):
    assert len(small_dataset) == N_SMALL
    assert small_dataset.column_names == ["id", "images", "prompt", "response", "kind"]
    assert isinstance(small_dataset.features["images"].feature, datasets.Image)
    assert small_dataset["id"] == list(range(N_SMALL))
    again = synthetic.generate_synthetic_dataset(None, N_SMALL, seed=0)
    assert _sizes(again) == _sizes(small_dataset)
    assert again["kind"] == small_dataset["kind"]
    assert again["prompt"] == small_dataset["prompt"] and again["response"] == small_dataset["response"]
    assert again.data.column("images").to_pylist() == small_dataset.data.column("images").to_pylist()
    other = synthetic.generate_synthetic_dataset(None, N_SMALL, seed=1)
    assert other["kind"] != small_dataset["kind"]
    assert _sizes(other) != _sizes(small_dataset)
    assert all(isinstance(im, Image.Image) for row in small_dataset for im in row["images"])


def test_kind_mix_and_sizes(small_dataset):
    assert abs(sum(synthetic.KIND_MIX.values()) - 1.0) < 1e-9
    for n in (1, 7, 40, 512, 1000):
        counts = synthetic.kind_counts(n)
        assert sum(counts.values()) == n
        for kind, share in synthetic.KIND_MIX.items():
            assert abs(counts[kind] - share * n) < 1
    kinds = small_dataset["kind"]
    assert {k: kinds.count(k) for k in synthetic.KINDS} == synthetic.kind_counts(N_SMALL)
    for row in small_dataset:
        sizes = [im.size for im in row["images"]]
        kind = row["kind"]
        if kind == "text":
            assert sizes == []
            continue
        if kind == "multi":
            assert 2 <= len(sizes) <= 4
            assert all(max(s) <= 512 for s in sizes)
            continue
        assert len(sizes) == 1
        (w, h), = sizes
        if kind == "receipt":
            assert 400 <= w <= 800 and 1000 <= h <= 2400 and h > w
        elif kind == "document":
            assert 820 <= w <= 1760 and 1060 <= h <= 2270 and 1.2 < h / w < 1.4
        elif kind == "chart":
            assert 600 <= w <= 1200 and 0.49 <= h / w <= 0.76
        elif kind == "photo":
            assert 256 <= max(w, h) <= 1024
            assert any(abs(max(w, h) / min(w, h) - max(a) / min(a)) < 0.02 for a in synthetic.PHOTO_ASPECTS)
        elif kind == "thumbnail":
            assert max(w, h) < 100


def test_bad_num_samples():
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError):
            synthetic.generate_synthetic_dataset(None, bad)


# --------------------------------------------------------------------------------------------------
# Path validation


def test_check_processor_path(tmp_path, processor_dir):
    assert check_processor_path(processor_dir) == processor_dir
    with pytest.raises(ConfigError) as info:
        check_processor_path(tmp_path / "missing")
    assert info.value.setting == "processor" and "does not exist" in str(info.value)
    with pytest.raises(ConfigError, match="no tokenizer"):
        check_processor_path(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match="no image processor"):
        check_processor_path(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_processor(tmp_path / "missing", 128)
    assert info.value.setting == "processor"


def test_check_dataset_path(tmp_path, small_dataset_dir):
    assert check_dataset_path(small_dataset_dir) == small_dataset_dir
    for bad, words in ((tmp_path / "missing", "does not exist"), (tmp_path, "save_to_disk")):
        with pytest.raises(ConfigError) as info:
            check_dataset_path(bad)
        assert info.value.setting == "dataset" and words in str(info.value)


def test_open_dataset_checks_columns_and_splits(tmp_path):
    datasets.Dataset.from_dict({"prompt": ["a"], "answer": ["b"]}).save_to_disk(str(tmp_path / "cols"))
    with pytest.raises(ConfigError, match="response") as info:
        open_source(tmp_path / "cols")
    assert info.value.setting == "dataset"
    text = datasets.Dataset.from_dict({"prompt": ["a"], "response": ["b"]})
    datasets.DatasetDict({"train": text, "test": text}).save_to_disk(str(tmp_path / "dict"))
    assert open_dataset(tmp_path / "dict")[0] == {"prompt": "a", "response": "b"}
    datasets.DatasetDict({"a": text, "b": text}).save_to_disk(str(tmp_path / "nosplit"))
    with pytest.raises(ConfigError, match="splits"):
        open_dataset(tmp_path / "nosplit")
