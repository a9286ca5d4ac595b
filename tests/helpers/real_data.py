"""Tiny datasets in every source and conversation format, written to a folder for the real-data tests.

Row ``i`` is a pure function of ``i``: 0, 1 or 2 images (small PNGs of a few sizes), one or two
exchanges of user question and assistant reply. :func:`replies` gives each row's assistant texts, which
are exactly the tokens its labels may train.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

FORMATS = ("disk", "parquet", "jsonl", "llava")


def num_images(i: int) -> int:
    return (0, 1, 2, 1)[i % 4]


def turns(i: int) -> list[tuple[str, str]]:
    """(question, reply) pairs of row ``i``."""
    first = (f"what is shown in picture {i}?", f"a drawing of {i % 7} boxes.")
    second = (f"and how many lines are there in {i}?", f"there are {i % 5} lines")
    return [first, second] if i % 3 else [first]


def replies(i: int) -> list[str]:
    return [reply for _, reply in turns(i)]


def questions(i: int) -> list[str]:
    return [question for question, _ in turns(i)]


def image(i: int, k: int) -> Image.Image:
    rng = np.random.default_rng([i, k])
    height, width = (40, 70, 100, 130)[(i + k) % 4], (60, 40, 120, 90)[(i * 3 + k) % 4]
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))


def png(img: Image.Image) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return buffer.getvalue()


def _messages(i: int, as_parts: bool) -> list[dict]:
    messages = []
    for n, (question, reply) in enumerate(turns(i)):
        if as_parts:
            parts = [{"type": "image", "text": None}] * (num_images(i) if n == 0 else 0) + [{"type": "text", "text": question}]
            messages += [{"role": "user", "content": parts}, {"role": "assistant", "content": [{"type": "text", "text": reply}]}]
        else:  # a string: the row's images go first in the first user turn
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
    return messages


def write_dataset(folder: Path, fmt: str, size: int) -> tuple[str, Path]:
    """Write ``size`` rows in format ``fmt``; returns (the --dataset value, the --image-folder)."""
    import datasets

    folder.mkdir(parents=True, exist_ok=True)
    images = folder / "images"
    images.mkdir(exist_ok=True)
    names = {}
    for i in range(size):
        names[i] = []
        for k in range(num_images(i)):
            name = f"{i:03d}-{k}.png"
            image(i, k).save(images / name)
            names[i].append(name)
    if fmt == "disk":
        features = datasets.Features({
            "images": datasets.List(datasets.Image()),
            "messages": datasets.List({"role": datasets.Value("string"), "content": datasets.List(
                {"type": datasets.Value("string"), "text": datasets.Value("string")})}),
        })
        rows = {"images": [[image(i, k) for k in range(num_images(i))] for i in range(size)],
                "messages": [_messages(i, True) for i in range(size)]}
        datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(folder / "disk"))
        return str(folder / "disk"), images
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        half = size // 2
        for part, rows in enumerate((range(half), range(half, size))):
            table = pa.table({
                "images": [[png(image(i, k)) for k in range(num_images(i))] for i in rows],
                "messages": [_messages(i, False) for i in rows],
            })
            pq.write_table(table, folder / f"part-{part}.parquet")
        return str(folder / "part-*.parquet"), images
    if fmt == "jsonl":
        with open(folder / "rows.jsonl", "w") as out:
            for i in range(size):
                out.write(json.dumps({"images": names[i], "messages": _messages(i, True)}) + "\n")
        return str(folder / "rows.jsonl"), images
    if fmt == "llava":
        rows = []
        for i in range(size):
            conversation = []
            for n, (question, reply) in enumerate(turns(i)):
                marker = "<image>\n" * num_images(i) if n == 0 else ""
                conversation += [{"from": "human", "value": marker + question}, {"from": "gpt", "value": reply}]
            row = {"id": f"row-{i}", "conversations": conversation}
            if names[i]:
                row["image"] = names[i] if len(names[i]) > 1 else names[i][0]
            rows.append(row)
        (folder / "llava.json").write_text(json.dumps(rows))
        return str(folder / "llava.json"), images
    raise ValueError(fmt)
