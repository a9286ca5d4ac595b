"""Images that read as fine from their header but cannot be decoded, under the default ``rows`` payload with
--skip-bad-samples. A file that is not whole (cut short, garbage after the header) is refused by every module
before the exchange (a whole-file check, no pixel decoded) and replaced alike on every module; a whole file
whose compressed data is corrupt fails only where it is decoded, after the exchange, and is masked on every
module (agreed on over the job's ranks). Either way the run completes, every module holds the same samples,
and the summary counts both. Through `mimo-pipes run`'s per-rank body on the pool's Gloo ranks, on several
layouts."""

from __future__ import annotations

import io
import json
import re
import struct
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from dist_pool import shared_pool
from job_runs import read_dumps, run_in_pool
from PIL import Image
from real_data import write_dataset

from mimo_pipes.data.bad_rows.complete_files import incomplete_reason
from mimo_pipes.parallel.sharding import global_microbatch_indices

POOL_PRELOAD = ("megatron.energon",)  # the jobs' ranks read energon datasets (tests/distributed/conftest.py)

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "vlm_sft.py")  # this checkout's, by path
SIZE, BATCH, STEPS, SEED, WINDOW = 24, 4, 6, 5, 2  # 6 steps of 4 read the whole epoch: every bad row is met
COMMON = ["--micro-batch-size", str(BATCH), "--seq-length", "256", "--seed", str(SEED), "--quiet", "--exchange-timeout", "30",
          "--scalable-dp", "--intra-microbatch-reorder", "--reorder-window-size", str(WINDOW), "--skip-bad-samples",
          "--recipe", RECIPE]
LAYOUTS = {
    "language dp2 + images dp2": [],
    "language dp4 + images dp2": ["--component", "language=dp=4", "--component", "images=dp=2,rank_offset=4"],
    "language dp2 + images dp1, packed": ["--component", "language=dp=2", "--component", "images=dp=1,rank_offset=2",
                                          "--pack-sequences-in-batch"],
    # Samples move across micro-batches; rows keep their image paths; two processing threads per rank.
    "language dp3 + images dp1, across, paths": ["--component", "language=dp=3", "--component", "images=dp=1,rank_offset=3",
                                                 "--micro-batch-size", "6", "--reorder-across-microbatches",
                                                 "--exchange-image-paths", "--num-workers", "2"],
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


def _png_with_idat(png: bytes, idat: bytes) -> bytes:
    """``png`` with its image data replaced by ``idat``, every chunk's CRC right: a whole file."""
    out, position = png[:8], 8
    while position < len(png):
        length = struct.unpack(">I", png[position : position + 4])[0]
        kind, data = png[position + 4 : position + 8], png[position + 8 : position + 8 + length]
        if kind == b"IDAT":
            data = idat
        out += struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        position += 12 + length
    return out


def _corrupt_inside() -> dict[str, bytes]:
    """File name -> whole files (every chunk framed, CRCs right) whose compressed pixels cannot be decoded."""
    png = _encoded("PNG", 6)
    noise = np.random.default_rng(7).integers(0, 256, 3000, dtype=np.uint8).tobytes()
    return {
        "noise-inside.png": _png_with_idat(png, noise),  # not a zlib stream
        "short-inside.png": _png_with_idat(png, zlib.compress(b"\0" * 100)),  # a valid stream, far too few pixels
    }


@pytest.fixture(scope="module")
def corrupt_dataset(tmp_path_factory):
    spec, images = write_dataset(tmp_path_factory.mktemp("bad-images"), "jsonl", SIZE)
    rows = [json.loads(line) for line in open(spec)]
    bad, inside = {}, {}
    with_images = [i for i, row in enumerate(rows) if row.get("images")]
    for kinds, chosen, found in ((_corrupt(), with_images[1::3], bad), (_corrupt_inside(), with_images[2::3], inside)):
        for (name, data), row in zip(kinds.items(), chosen):
            (images / name).write_bytes(data)
            rows[row]["images"][0] = name
            found[row] = name
    with open(spec, "w") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    return ["--dataset", spec, "--image-folder", str(images)], bad, inside


def test_the_corrupt_files_read_as_images_but_are_not_whole():
    for name, data in _corrupt().items():
        if data:
            assert Image.open(io.BytesIO(data)).size == (160, 120), name  # the header counts them
            with pytest.raises(OSError), Image.open(io.BytesIO(data)) as image:
                image.load()  # and decoding fails
        assert incomplete_reason(data) is not None, name
    for name, data in _corrupt_inside().items():
        assert Image.open(io.BytesIO(data)).size == (160, 120), name
        with pytest.raises(OSError), Image.open(io.BytesIO(data)) as image:
            image.load()
        assert incomplete_reason(data) is None, name  # whole: only decoding finds the fault
    for fmt in ("PNG", "JPEG", "GIF", "WEBP"):
        assert incomplete_reason(_encoded(fmt, 4)) is None, fmt


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_undecodable_images_are_replaced_or_masked_alike_on_every_module(corrupt_dataset, layout, tmp_path):
    flags, bad, inside = corrupt_dataset
    dumps = tmp_path / "dumps"
    batch = 6 if "--micro-batch-size" in LAYOUTS[layout] else BATCH
    steps = SIZE // batch  # the whole epoch: every bad row is met
    outcome = run_in_pool(shared_pool(), [*flags, *COMMON, *LAYOUTS[layout], "--steps", str(steps),
                                          "--dump-assignments", str(dumps)])
    stdout = outcome["stdout"]
    assert f"skipped {len(bad)} bad dataset row(s)" in stdout, stdout
    skip_report, mask_report = stdout.split("skipped ", 1)[1].split("\nmasked ", 1)
    listed = dict((int(row), why) for row, why in re.findall(r"^  row (\d+): (.*)$", skip_report, flags=re.MULTILINE))
    assert sorted(listed) == sorted(bad)
    named = dict((int(row), why) for row, why in re.findall(r"^  row (\d+): (.*)$", mask_report, flags=re.MULTILINE))
    assert sorted(named) == sorted(inside) and all("cannot be decoded" in why for why in named.values()), named
    assert all("cannot be decoded" in why or "image" in why for why in listed.values()), listed
    # The whole files that fail where they are decoded: masked, on every module, and named.
    assert f"masked {len(inside)} row(s) that failed after the exchange (--skip-bad-samples), on every module" in stdout, stdout
    held: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    masked: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for record in read_dumps(dumps):
        held[record["module"]][record["step"]].extend(record["sample_ids"])
        masked[record["module"]][record["step"]].extend(record["masked_ids"])
    assert set(held) == {"language", "images"}
    for step in range(steps):  # the run completed every step, each module holding the same samples
        language, images = sorted(held["language"][step]), sorted(held["images"][step])
        assert language == images and len(language) == batch, (step, language, images)
        assert not set(language) & set(bad)
        assert sorted(masked["language"][step]) == sorted(masked["images"][step]) == [i for i in language if i in inside], step
    for first in range(0, steps, WINDOW):  # only the bad rows were replaced (samples may move inside a window)
        window = range(first, min(first + WINDOW, steps))
        read = {int(i) for step in window for i in global_microbatch_indices(step, SIZE, batch, SEED, True)}
        assert read - set(bad) <= {i for step in window for i in held["language"][step]}
    assert {row for steps in masked["images"].values() for row in steps} == set(inside)


def test_a_resumed_run_masks_the_same_rows(corrupt_dataset, tmp_path):
    """Stopped inside the epoch (the windows read ahead are dropped: their agreements still pair up on every
    rank) and resumed: the same micro-batches, the same rows masked, as in one run."""
    flags, _, inside = corrupt_dataset
    argv = [*flags, *COMMON, "--steps", str(STEPS)]
    whole, parts, state = tmp_path / "whole", tmp_path / "parts", tmp_path / "state"
    run_in_pool(shared_pool(), [*argv, "--dump-assignments", str(whole)])
    run_in_pool(shared_pool(), [*argv, "--dump-assignments", str(parts), "--stop-after", "1", "--save-state", str(state)])
    resumed = run_in_pool(shared_pool(), [*argv, "--dump-assignments", str(parts), "--resume", str(state)])
    assert read_dumps(parts) == read_dumps(whole)
    assert any(record["masked_ids"] for record in read_dumps(whole) if record["step"] >= 1)  # masked after the resume too
    assert "failed after the exchange (--skip-bad-samples), on every module" in resumed["stdout"]


def test_training_goes_on_over_masked_rows(corrupt_dataset):
    """`mimo-pipes train` on the same data: the masked samples reach the model (blank pixels, no label) and
    every iteration's loss is finite."""
    from job_runs import train_in_pool

    flags, _, inside = corrupt_dataset
    common = [flag for flag in COMMON if flag not in ("--recipe", RECIPE)]  # train's own recipe, which builds vlm_sft's graph
    argv = [*flags, *common, "--steps", str(STEPS), "--global-batch-size", str(2 * BATCH), "--log-interval", "1",
            "--component", "language=dp=2", "--component", "images=dp=1,rank_offset=2"]
    outcomes = [o for o in train_in_pool(shared_pool(), argv) if o]
    stdout = outcomes[0]["stdout"]
    losses = [float(loss) for loss in re.findall(r"^\s+\d+\s+(\d+\.\d+|nan|inf)\s", stdout, flags=re.MULTILINE)]
    assert len(losses) == STEPS // 2 and all(np.isfinite(losses)), stdout
    assert f"masked {len(inside)} row(s) that failed after the exchange" in stdout, stdout


def test_an_energon_dataset_masks_its_undecodable_images_alike(tmp_path):
    """The same agreement when the images travel as bytes out of Energon shards: whole PNGs with corrupt
    pixels in two samples are masked on both modules, the run completes."""
    from energon_data import CRUDE_YAML, crude_sample, write_shards

    samples = [crude_sample(i) for i in range(SIZE)]
    inside = list(_corrupt_inside().values())
    hit = [i for i, sample in enumerate(samples) if "0.png" in sample][2::5][: len(inside)]
    for i, data in zip(hit, inside):
        samples[i]["0.png"] = data
    dataset = write_shards(tmp_path / "energon", samples, 6, CRUDE_YAML)
    dumps = tmp_path / "dumps"
    common = [flag for flag in COMMON if flag not in ("--recipe", RECIPE)]
    outcome = run_in_pool(shared_pool(), ["--dataset", str(dataset), *common, "--recipe", RECIPE, "--steps", str(STEPS),
                                          "--component", "language=dp=2", "--component", "images=dp=2,rank_offset=2",
                                          "--dump-assignments", str(dumps)])
    assert f"masked {len(hit)} row(s) that failed after the exchange (--skip-bad-samples), on every module" in outcome["stdout"]
    masked: dict[str, list[int]] = defaultdict(list)
    for record in read_dumps(dumps):
        masked[record["module"]].extend(record["masked_ids"])
    assert sorted(masked["language"]) == sorted(masked["images"]) and set(masked["images"]) == set(hit), dict(masked)
