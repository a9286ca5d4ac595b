"""`mimo-pipes analyze`'s counts come from image headers for every image form the processor takes (raw bytes,
``{"bytes", "path"}`` values, paths, ``datasets.Image`` columns, PIL images, arrays): equal to processing
each row, with no row processed and no encoded image decoded; analyze says how many rows were processed
to be counted, and why."""

from __future__ import annotations

import io
import json

import datasets
import numpy as np
import PIL.ImageFile
import pytest
from job_runs import analyze_here
from PIL import Image

from mimo_pipes.analysis.row_counts import count_rows, processed_counter
from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.processor import SampleProcessor, load_processor
from mimo_pipes.data.sources.open_source import open_source

SIZES = [(40, 30), (120, 300), (700, 500), (33, 990), (256, 256)]  # (height, width)


def pixels(height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)


def encoded(height: int, width: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels(height, width, seed)).save(buffer, format="PNG" if seed % 2 else "JPEG")
    return buffer.getvalue()


def rows(form: str, folder) -> list:
    """One row per size with its image in ``form``, and a row without any."""
    out = []
    for k, (height, width) in enumerate(SIZES):
        if form in ("path", "path dict"):
            name = f"{k}.{'png' if k % 2 else 'jpg'}"
            (folder / name).write_bytes(encoded(height, width, k))
            image = name if form == "path" else {"bytes": None, "path": name}
        else:
            image = {"bytes": encoded(height, width, k), "bytes dict": {"bytes": encoded(height, width, k), "path": None},
                     "PIL": Image.fromarray(pixels(height, width, k)), "array": pixels(height, width, k)}.get(form, encoded(height, width, k))
        out.append({"images": [image], "prompt": f"what is in picture {k}?", "response": f"{k} boxes"})
    out.append({"images": [], "prompt": "no picture", "response": "only text"})
    return out


def dataset_of(form: str, folder):
    if form == "datasets.Image":  # decoded as its features say: the counts read it undecoded
        data = rows("bytes dict", folder)
        features = datasets.Features({"images": datasets.Sequence(datasets.Image()), "prompt": datasets.Value("string"),
                                      "response": datasets.Value("string")})
        return datasets.Dataset.from_list(data, features=features)
    if form == "datasets.Image, as a run opens it":
        dataset_of("datasets.Image", folder).save_to_disk(str(folder / "saved"))
        return open_source(str(folder / "saved"))
    return rows(form, folder)


FORMS = ["bytes", "bytes dict", "path", "path dict", "datasets.Image", "datasets.Image, as a run opens it", "PIL", "array"]


@pytest.mark.parametrize("form", FORMS)
def test_every_image_form_is_counted_from_its_header_as_processing_counts_it(form, tmp_path, monkeypatch):
    processor = load_processor(default_processor_path(), 2048, image_folder=str(tmp_path))
    dataset = dataset_of(form, tmp_path)
    slow = processed_counter(processor, processor.placeholder_ids)
    expected = [slow({**dataset[k], "sample_id": k}) for k in range(len(dataset))]

    def refuse(*args, **kwargs):
        raise AssertionError("processed or decoded to be counted")

    monkeypatch.setattr(SampleProcessor, "__call__", refuse)
    monkeypatch.setattr(PIL.ImageFile.ImageFile, "load", refuse)  # no encoded image is decoded
    counts = count_rows(dataset, processor, runs=True, use_cache=False)
    assert list(zip(counts.image_tokens.tolist(), counts.real_tokens.tolist())) == expected
    assert counts.processed_for_cost == 0 and counts.processed_reasons == {}
    assert len(set(counts.image_tokens.tolist())) == len(SIZES) + 1  # the resize rule was exercised


def _llava_rows(folder, count: int, offset: int) -> str:
    (folder / "images").mkdir(exist_ok=True)
    lines = []
    for k in range(count):
        name = f"{offset + k}.png"
        (folder / "images" / name).write_bytes(encoded(60 + 10 * k, 80, 2 * k + 1))
        lines.append(json.dumps({"id": offset + k, "image": name, "conversations": [
            {"from": "human", "value": f"<image>\nWhat is picture {offset + k}?"}, {"from": "gpt", "value": "Noise."}]}))
    path = folder / f"llava-{offset}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def analyze_costs_line(folder, dataset: str) -> str:
    status, stdout, stderr = analyze_here(["--dataset", dataset, "--image-folder", str(folder / "images"), "--micro-batch-size", "4",
                                           "--steps", "2", "--quiet", "--out", str(folder / "out")])
    assert status == 0, stderr
    return next(line for line in stdout.splitlines() if line.startswith("costs:"))


def test_analyze_says_every_row_was_counted_from_headers(tmp_path):
    assert analyze_costs_line(tmp_path, _llava_rows(tmp_path, 8, 0)) == "costs: all 8 rows counted from their text and image headers, none processed"


def test_analyze_says_how_many_rows_were_processed_to_count_them_and_why(tmp_path, monkeypatch):
    processor = load_processor(default_processor_path(), 2048)
    dataset = _llava_rows(tmp_path, 8, 100)  # rows no earlier test counted: nothing comes from the counts' cache
    monkeypatch.setattr(type(processor.family), "image_grid", lambda *args: (_ for _ in ()).throw(ValueError("no rule here")))
    assert analyze_costs_line(tmp_path, dataset) == "costs: 8 of 8 rows were processed to count them (ValueError: no rule here: 8 rows)"
