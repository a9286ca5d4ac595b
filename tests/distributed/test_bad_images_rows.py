"""Images that read as fine from their header but cannot be decoded, under the default ``rows`` payload with
--skip-bad-samples: every module refuses them before the exchange (a whole-file check, no pixel decoded), so
each is replaced alike on every module, the run completes, and the summary counts the skip. Through
`mimo-pipes run`'s per-rank body on the pool's Gloo ranks, on several layouts."""

from __future__ import annotations

import io
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from dist_pool import shared_pool
from job_runs import read_dumps, run_in_pool
from PIL import Image
from real_data import write_dataset

from mimo_pipes.data.complete_files import incomplete_reason
from mimo_pipes.parallel.sharding import global_microbatch_indices

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "vlm_sft.py")  # this checkout's, by path
SIZE, BATCH, STEPS, SEED = 24, 4, 6, 5  # 6 steps of 4 read the whole epoch: every bad row is met
COMMON = ["--micro-batch-size", str(BATCH), "--seq-length", "256", "--seed", str(SEED), "--quiet", "--exchange-timeout", "30",
          "--scalable-dp", "--intra-microbatch-reorder", "--reorder-window-size", "2", "--skip-bad-samples",
          "--recipe", RECIPE]
LAYOUTS = {
    "language dp2 + images dp2": [],
    "language dp4 + images dp2": ["--component", "language=dp=4", "--component", "images=dp=2,rank_offset=4"],
    "language dp2 + images dp1": ["--component", "language=dp=2", "--component", "images=dp=1,rank_offset=2"],
}


def _encoded(fmt: str, seed: int) -> bytes:
    pixels = (np.random.default_rng(seed).random((120, 160, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def _corrupt() -> dict[str, bytes]:
    """File name -> bytes whose header PIL reads (except the empty one) and whose pixels it cannot decode."""
    png, jpeg = _encoded("PNG", 1), _encoded("JPEG", 2)
    noise = np.random.default_rng(3).integers(0, 256, 4000, dtype=np.uint8).tobytes()
    return {
        "cut.png": png[: len(png) // 2],  # truncated after the header
        "cut.jpg": jpeg[: len(jpeg) * 2 // 3],
        "garbage.png": png[:60] + noise,  # a valid header, then garbage
        "garbage.jpg": jpeg[:700] + noise,
        "empty.png": b"",  # zero-length
    }


@pytest.fixture(scope="module")
def corrupt_dataset(tmp_path_factory):
    spec, images = write_dataset(tmp_path_factory.mktemp("bad-images"), "jsonl", SIZE)
    rows = [json.loads(line) for line in open(spec)]
    bad = {}
    with_images = [i for i, row in enumerate(rows) if row.get("images")]
    for (name, data), row in zip(_corrupt().items(), with_images[1::3]):
        (images / name).write_bytes(data)
        rows[row]["images"][0] = name
        bad[row] = name
    with open(spec, "w") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    return ["--dataset", spec, "--image-folder", str(images)], bad


def test_the_corrupt_files_read_as_images_but_are_not_whole():
    for name, data in _corrupt().items():
        if data:
            assert Image.open(io.BytesIO(data)).size == (160, 120), name  # the header counts them
            with pytest.raises(OSError), Image.open(io.BytesIO(data)) as image:
                image.load()  # and decoding fails
        assert incomplete_reason(data) is not None, name
    for fmt in ("PNG", "JPEG", "GIF", "WEBP"):
        assert incomplete_reason(_encoded(fmt, 4)) is None, fmt


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_undecodable_images_are_replaced_alike_on_every_module(corrupt_dataset, layout, tmp_path):
    flags, bad = corrupt_dataset
    dumps = tmp_path / "dumps"
    outcome = run_in_pool(shared_pool(), [*flags, *COMMON, *LAYOUTS[layout], "--steps", str(STEPS),
                                          "--dump-assignments", str(dumps)])
    stdout = outcome["stdout"]
    assert f"skipped {len(bad)} bad dataset row(s)" in stdout, stdout
    listed = dict((int(row), why) for row, why in re.findall(r"^  row (\d+): (.*)$", stdout, flags=re.MULTILINE))
    assert sorted(listed) == sorted(bad)
    assert all("cannot be decoded" in why or "image" in why for why in listed.values()), listed
    held: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for record in read_dumps(dumps):
        held[record["module"]][record["step"]].extend(record["sample_ids"])
    assert set(held) == {"language", "images"}
    for step in range(STEPS):  # the run completed every step, each module holding the same samples
        language, images = sorted(held["language"][step]), sorted(held["images"][step])
        assert language == images and len(language) == BATCH, (step, language, images)
        assert not set(language) & set(bad)
        read = {int(i) for i in global_microbatch_indices(step, SIZE, BATCH, SEED, True)}
        assert read - set(bad) <= set(language)  # only the bad rows were replaced
