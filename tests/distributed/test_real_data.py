"""Real data: every source format, conversation format and processor family, through the processor, the
collation, the Gloo exchange and `mimo-pipes run`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from job_runs import analyze_here, run_in_pool, summary_lines
from real_data import FORMATS, image, num_images, questions, replies, write_dataset
from scenarios_real_data import run_dataloaders, run_mrope, run_real_data
from test_analyze import assert_analysis_is_the_summary
from test_cli_run import read_dumps

from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.embedded.family_processors import FAMILIES, INTERNVL_IMAGE_SEQ_LENGTH, build_family_processor
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.data.sources.open_source import open_source
from mimo_pipes.errors import ConfigError, SampleError
from mimo_pipes.exchange.wire_format import decode_samples, encode_samples
from mimo_pipes.nodes.uncollate import Uncollate
from mimo_pipes.parallel.sharding import global_microbatch_indices
from mimo_pipes.samples.collate import VISION_ROWS, collate_microbatch
from mimo_pipes.samples.cost import image_token_count

SIZE = 24


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, tuple[str, Path]]:
    root = tmp_path_factory.mktemp("sources")
    return {fmt: write_dataset(root / fmt, fmt, SIZE) for fmt in FORMATS}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("families")
    return {family: str(build_family_processor(root / family, family)) for family in FAMILIES}


def _process(processor, dataset, index):
    return processor(dict(dataset[index], sample_id=index))


# ----------------------------------------------------------------------------------------------------
# Sources and conversations


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_source_opens_memory_mapped_with_images_undecoded(sources, fmt):
    spec, _ = sources[fmt]
    dataset = open_source(spec)
    assert len(dataset) == SIZE and dataset.cache_files  # Arrow files on disk, memory-mapped
    row = dataset[1]
    images = row.get("images", row.get("image"))
    images = images if isinstance(images, list) else [images]
    assert len(images) == num_images(1)
    assert not any(hasattr(item, "load") for item in images)  # never decoded by the dataset


@pytest.mark.parametrize("fmt", FORMATS)
def test_labels_train_every_assistant_turn_and_nothing_else(sources, fmt):
    spec, folder = sources[fmt]
    processor = load_processor(default_processor_path(), 1024, image_folder=str(folder))
    dataset = open_source(spec)
    encode = processor.tokenizer.backend_tokenizer.encode
    for index in range(8):
        out = _process(processor, dataset, index)
        ids, labels = out["input_ids"], out["labels"]
        trained = labels != -100
        assert torch.equal(labels[trained], ids[1:][trained[:-1]])  # next-token labels
        expected = [encode(reply + "<|im_end|>", add_special_tokens=False).ids for reply in replies(index)]
        assert int(trained.sum()) == sum(map(len, expected))
        # Each assistant reply is one run of trained tokens, in order; no question token is trained.
        runs, current = [], []
        for t in range(len(ids) - 1):
            if trained[t]:
                current.append(int(ids[t + 1]))
            elif current:
                runs, current = runs + [current], []
        assert runs + ([current] if current else []) == expected
        text = processor.tokenizer.decode(labels[trained].tolist())
        assert not any(question in text for question in questions(index))
        assert count_images(out) == num_images(index)


def count_images(sample) -> int:
    return int(sample["image_grid_thw"].shape[0]) if "image_grid_thw" in sample else 0


def test_bad_sources_are_refused_naming_the_setting(tmp_path, sources, monkeypatch):
    (tmp_path / "a.csv").write_text("x\n1\n")
    for spec in (str(tmp_path / "a.csv"), str(tmp_path / "none-*.jsonl"), str(tmp_path / "missing.json")):
        with pytest.raises(ConfigError, match="^dataset: "):  # from Python: the field
            open_source(spec)
        monkeypatch.setenv("MIMO_PIPES_SETTING_NAMES", "flags")
        with pytest.raises(ConfigError, match="^--dataset: "):  # inside a command: its flag
            open_source(spec)
        monkeypatch.delenv("MIMO_PIPES_SETTING_NAMES")
    (tmp_path / "cols.jsonl").write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ConfigError, match="none of the columns messages, conversations"):
        open_source(str(tmp_path / "cols.jsonl"))


def test_bad_rows_name_the_dataset_row_and_cause(tmp_path, sources):
    spec, folder = sources["jsonl"]
    processor = load_processor(default_processor_path(), 1024, image_folder=str(folder))
    broken = folder / "broken.png"
    broken.write_bytes(b"not a png")
    cases = {
        "cannot be decoded": {"images": [str(broken)], "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        "does not exist": {"images": ["nope.png"], "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        "no assistant text": {"messages": [{"role": "user", "content": "q"}]},
        "no text": {"images": ["000-0.png"]},
        "names 2 images but the row has 1": {"images": ["001-0.png"], "conversations": [
            {"from": "human", "value": "<image><image>q"}, {"from": "gpt", "value": "a"}]},
    }
    for cause, row in cases.items():
        with pytest.raises(SampleError, match=f"dataset row 17: .*{cause}") as info:
            processor(dict(row, sample_id=17))
        assert "\n" not in str(info.value) and info.value.sample_id == 17
    tight = load_processor(default_processor_path(), 8, image_folder=str(folder))
    with pytest.raises(SampleError, match=r"dataset row 17: needs \d+ tokens .* more than --seq-length 8"):
        tight({"sample_id": 17, "images": [image(1, 0)], "prompt": "q", "response": "a"})


# ----------------------------------------------------------------------------------------------------
# Processor families


def _family_rows():
    rng = np.random.default_rng(0)
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]},
                    {"role": "assistant", "content": "a cat"}]
    video_turns = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "and this?"}]},
                   {"role": "assistant", "content": "a dog"}]
    text = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]}
    one = {"images": [image(3, 0)], "messages": conversation}
    two = {"images": [image(4, 0), image(5, 1)], "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "both?"}]},
        {"role": "assistant", "content": "yes"}]}
    video = {"images": [image(6, 0)], "videos": [rng.integers(0, 255, (3, 50, 70, 3), dtype=np.uint8)],
             "messages": conversation + video_turns}
    return {"text": text, "one": one, "two": two, "video": video}


@pytest.mark.parametrize("family", FAMILIES)
def test_family_cost_equals_placeholders_and_collation_holds_each_samples_vision_rows(family_dirs, family):
    processor = load_processor(family_dirs[family], 2048)
    rows = _family_rows()
    if family == "internvl":
        del rows["video"]  # the tile family takes images only
    samples = {name: processor(dict(row, sample_id=k, step=0, slot=0)) for k, (name, row) in enumerate(rows.items())}
    for name, sample in samples.items():
        placeholders = image_token_count(sample["input_ids"], processor.placeholder_ids)
        if family == "internvl":
            tiles = sample.get("image_num_tiles", torch.zeros(0, dtype=torch.int64))
            assert placeholders == int(tiles.sum()) * INTERNVL_IMAGE_SEQ_LENGTH
            assert sample.get("pixel_values", torch.zeros(0, 3, 28, 28)).shape == (int(tiles.sum()), 3, 28, 28)
        else:
            merge2 = processor.merge_size**2
            expected = sum(int(sample[g].prod(dim=1).sum()) // merge2 for g in ("image_grid_thw", "video_grid_thw") if g in sample)
            assert placeholders == expected
        assert (placeholders > 0) == (name != "text")
    if family != "internvl":
        assert "pixel_values_videos" in samples["video"] and samples["video"]["video_grid_thw"].shape == (1, 3)
    text, image_samples = samples["text"], [s for n, s in samples.items() if n != "text"]
    for order in ([text, *image_samples], [*image_samples, text], [text]):
        batch = collate_microbatch(order, pad_length=None, vision_fields=processor.vision_fields)
        assert set(processor.vision_fields) <= set(batch)
        for name, (tail, dtype) in processor.vision_fields.items():
            assert batch[name].dtype == dtype and tuple(batch[name].shape[1:]) == tail
            assert batch[VISION_ROWS][name] == [s[name].shape[0] if name in s else 0 for s in order]
        back = list(Uncollate(iter([batch]), image_token_id=processor.image_token_id))
        for original, got in zip(order, back):
            for name in processor.vision_fields:
                if name in original:
                    assert torch.equal(got[name], original[name])
                else:
                    assert got[name].shape[0] == 0


# ----------------------------------------------------------------------------------------------------
# Through the Gloo exchange (labels checked on every collated micro-batch) and through `mimo-pipes run`


def _check_conservation_and_agreement(results, steps, seed):
    by_module: dict[str, dict[int, dict[int, list[int]]]] = {}
    for result in filter(None, results):
        for record in result["records"]:
            by_module.setdefault(result["module"], {}).setdefault(record["step"], {})[result["dp_rank"]] = record["sample_ids"]
    assert by_module["language"] == by_module["images"]  # module agreement, rank by rank
    assert sorted(by_module["language"]) == list(range(steps))
    for step, ranks in by_module["language"].items():
        got = sorted(sid for rank in sorted(ranks) for sid in ranks[rank])
        assert got == sorted(int(i) for i in global_microbatch_indices(step, SIZE, 4, seed, True))


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_through_the_exchange_trains_only_assistant_turns(gloo_pool, sources, fmt):
    spec, folder = sources[fmt]
    results = gloo_pool.run(run_real_data, spec, str(folder), str(default_processor_path()), steps=4, seed=5)
    _check_conservation_and_agreement(results, 4, 5)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_through_the_exchange(gloo_pool, sources, family_dirs, family):
    spec, folder = sources["jsonl"]
    results = gloo_pool.run(run_real_data, spec, str(folder), family_dirs[family], steps=2, seed=6)
    _check_conservation_and_agreement(results, 2, 6)


def test_three_row_position_ids_of_a_users_map_function_through_the_exchange(gloo_pool, sources):
    spec, folder = sources["disk"]
    results = gloo_pool.run(run_mrope, spec, str(folder), str(default_processor_path()), steps=3, seed=9)
    _check_conservation_and_agreement(results, 3, 9)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_field_crosses_the_wire_format(family_dirs, family):
    processor = load_processor(family_dirs[family], 2048)
    rows = _family_rows()
    if family == "internvl":
        del rows["video"]
    samples = [processor(dict(row, sample_id=k)) for k, row in enumerate(rows.values())]
    samples[0]["position_ids"] = samples[0]["position_ids"].expand(3, -1).clone()  # M-RoPE rows
    back = decode_samples(encode_samples(samples), len(samples))
    for original, got in zip(samples, back):
        assert set(got) == set(original)
        for name, value in original.items():
            if isinstance(value, torch.Tensor):
                assert got[name].dtype == value.dtype and torch.equal(got[name], value), name


REORDER = ["--scalable-dp", "--intra-microbatch-reorder", "--reorder-window-size", "2", "--quiet", "--micro-batch-size", "4"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_through_mimo_pipes_run_and_analyze(gloo_pool, sources, tmp_path, fmt):
    """`run` (its per-rank body on the pool) conserves and agrees on every source format, and `analyze` with
    the same flags reads the same source (image folder included) and predicts its summary exactly."""
    spec, folder = sources[fmt]
    flags = ["--dataset", spec, "--image-folder", str(folder), "--steps", "4", "--seed", "7", *REORDER]
    outcome = run_in_pool(gloo_pool, [*flags, "--dump-assignments", str(tmp_path / "dumps")])
    dumps = read_dumps(tmp_path / "dumps")
    results = [{"module": r[0]["module"], "dp_rank": r[0]["dp_rank"], "records": r} for r in dumps.values()]
    _check_conservation_and_agreement(results, 4, 7)
    status, _, stderr = analyze_here([*flags, "--out", str(tmp_path / "analysis")])
    assert status == 0, stderr
    assert_analysis_is_the_summary(json.loads((tmp_path / "analysis" / "analysis.json").read_text()), summary_lines(outcome["stdout"]))



# ----------------------------------------------------------------------------------------------------
# DataLoader and StatefulDataLoader


def test_dataloaders_serve_the_graphs_stream_and_resume_mid_window(gloo_pool, sources):
    spec, folder = sources["llava"]
    results = gloo_pool.run(run_dataloaders, spec, str(folder), str(default_processor_path()), steps=5, stop=3, seed=8)
    for result in filter(None, results):
        assert result["plain"] == result["own"]
        assert result["resumed"] == result["own"]  # stopped after 3 of windows of 2: inside a window


def test_rank_micro_batches_refuses_loader_workers():
    from torch.utils.data import DataLoader

    from mimo_pipes.adapters.dataloader import RankMicroBatches

    with pytest.raises(RuntimeError, match="num_workers=0"):
        next(iter(DataLoader(RankMicroBatches(lambda: None), batch_size=None, num_workers=1)))


@pytest.mark.launch  # starts worker processes
def test_per_sample_processing_on_worker_processes_gives_the_same_stream(sources):
    from mimo_pipes.config import PipelineConfig
    from mimo_pipes.exchange import RankLayout
    from mimo_pipes_recipes.vlm_sft import build

    spec, folder = sources["parquet"]
    config = PipelineConfig(components=("language=dp=1", "images=dp=1,rank_offset=1"), micro_batch_size=2, seq_length=512,
                            dataset=spec, image_folder=str(folder), num_workers=2, seed=4)
    layout = RankLayout(dp_rank=0, dp_size=1, grid_size=1)
    streams = {}
    for processing in ("thread", "process"):
        loader = build(config, layout, processing=processing)
        batches = [next(iter(loader)) if k == 0 else next(loader) for k in range(4)]
        loader.close()
        streams[processing] = [(b["sample_ids"], b["input_ids"].tolist(), b["pixel_values"].sum().item()) for b in batches]
    assert streams["process"] == streams["thread"]
