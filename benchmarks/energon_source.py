"""One rank reading an Energon dataset: mimo-pipes' Energon source against Energon's own loader, side by side.

The same prepared VQA dataset (JPEGs of 300-1000 px a side, 1,000 samples a shard; generated once into a
cache folder) is read by each side in its own child process, one after the other, on the same cores:

* ``mimo``: the graph's reader (:class:`~mimo_pipes.nodes.CanonicalShardReader`, DP size 1, the seeded
  shuffled order) over :func:`~mimo_pipes.data.sources.open_source.open_source`, each row counted as the graph counts
  it before the exchange: its image's size from the header (no pixel decoded);
* ``energon``: ``get_train_dataset`` + ``get_savable_loader`` (``WorkerConfig`` of one rank, no worker
  processes, no batching, shuffle buffer 100, 100 samples a sequence) with a decoder that parses the JSON
  and leaves images as bytes, each sample's image size read from its header the same way.

Each side reads the dataset once to warm the page cache, then is timed over ``--samples`` samples; the
figures are samples per second, the child's peak resident memory (and what it was once the imports were
done), and the most files it held open beyond those it had before reading.

    python benchmarks/energon_source.py [--samples 20000] [--cache DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VERSION = "v1"
PER_SHARD = 1000
DISTINCT_IMAGES = 96  # encoded once, reused: the bytes read are what matter here, not their variety


def build(folder: Path, samples: int) -> Path:
    """The VQA dataset of ``samples`` samples in ``folder`` (kept when already complete)."""
    if (folder / ".nv-meta" / "dataset.yaml").is_file():
        return folder
    import numpy as np
    import webdataset as wds
    from megatron.energon.flavors.webdataset.prepare import WebdatasetPreparator
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    jpegs = []
    for _ in range(DISTINCT_IMAGES):
        height, width = (int(v) for v in rng.integers(300, 1001, 2))
        y, x = np.mgrid[0:height, 0:width]
        base = np.stack([(x * 255 // width), (y * 255 // height), ((x + y) * 127 // (width + height))], -1)
        pixels = np.clip(base + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)  # photo-like JPEG sizes
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=88)
        jpegs.append(buffer.getvalue())
    shards = []
    for start in range(0, samples, PER_SHARD):
        name = f"shard-{start // PER_SHARD:05d}.tar"
        with wds.TarWriter(str(folder / name)) as writer:
            for i in range(start, min(start + PER_SHARD, samples)):
                question = {"question": f"what is in picture {i}?", "answers": [f"picture {i} shows {i % 13} things"]}
                writer.write({"__key__": f"{i:08d}", "jpg": jpegs[i % DISTINCT_IMAGES], "json": json.dumps(question).encode()})
        shards.append(name)
    WebdatasetPreparator.prepare_dataset(folder, shards, split_parts_ratio=[("train", 1.0)], shuffle_seed=None, workers=2)
    (folder / ".nv-meta" / "dataset.yaml").write_text(
        "sample_type:\n  __module__: megatron.energon\n  __class__: VQASample\n"
        "field_map:\n  image: jpg\n  context: json[question]\n  answers: json[answers]\n")
    return folder


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def _header_size(data: bytes) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.height, image.width


def side_mimo(path: str, samples: int) -> dict:
    from mimo_pipes.data.processing.media_sizes import media_sizes
    from mimo_pipes.data.sources.open_source import open_source
    from mimo_pipes.nodes import CanonicalShardReader

    dataset = open_source(path)

    def read(count: int, seed: int) -> tuple[int, int]:
        reader = CanonicalShardReader(dataset, micro_batch_size=8, dp_rank=0, dp_size=1, grid_size=1, seed=seed, dataloader_type="cyclic")
        reader.reset()
        pixels, most = 0, 0
        for n in range(count):
            row = next(reader)
            pixels += sum(h * w for h, w in media_sizes(row, None, row["sample_id"]).images)
            if n % 1000 == 0:
                most = max(most, _open_files())
        return pixels, most

    read(len(dataset), seed=1)  # warm the page cache
    start = time.perf_counter()
    pixels, most = read(samples, seed=0)
    return {"seconds": time.perf_counter() - start, "pixels": pixels, "open_files": most}


def side_energon(path: str, samples: int) -> dict:
    import webdataset
    from megatron.energon import DefaultTaskEncoder, WorkerConfig, get_savable_loader, get_train_dataset
    from megatron.energon.flavors.webdataset.sample_decoder import SampleDecoder

    class JsonOnly(SampleDecoder):
        """Parses json and text parts; images stay encoded bytes."""

        def __init__(self) -> None:
            super().__init__()
            self._decoder = webdataset.autodecode.Decoder([])

    def read(count: int, seed: int) -> tuple[int, int]:
        encoder = DefaultTaskEncoder()
        encoder.decoder = JsonOnly()
        config = WorkerConfig(rank=0, world_size=1, num_workers=0, seed_offset=seed)
        dataset = get_train_dataset(path, worker_config=config, batch_size=None, shuffle_buffer_size=100, max_samples_per_sequence=100,
                                    task_encoder=encoder)
        loader = get_savable_loader(dataset)
        pixels, most = 0, 0
        for n, sample in enumerate(loader):
            if n == count:
                break
            height, width = _header_size(sample.image)
            pixels += height * width
            if n % 1000 == 0:
                most = max(most, _open_files())
        return pixels, most

    read(samples, seed=1)  # warm the page cache
    start = time.perf_counter()
    pixels, most = read(samples, seed=0)
    return {"seconds": time.perf_counter() - start, "pixels": pixels, "open_files": most}


def child(side: str, path: str, samples: int) -> None:
    import megatron.energon  # noqa: F401 - both sides import it (and torch): memory before reading
    import PIL.Image  # noqa: F401

    if side == "mimo":  # its own modules too (datasets and pyarrow come with them): what reading adds is the rest
        import mimo_pipes.data.processing.media_sizes  # noqa: F401
        import mimo_pipes.data.sources.open_source  # noqa: F401
        import mimo_pipes.nodes  # noqa: F401
    else:
        from megatron.energon import get_savable_loader, get_train_dataset  # noqa: F401

    before, imported = _open_files(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = (side_mimo if side == "mimo" else side_energon)(path, samples)
    result.update(side=side, samples=samples, samples_per_s=samples / result["seconds"], open_files=result["open_files"] - before,
                  peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, imported_rss_mb=imported)
    print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--cache", default=None, help="where the dataset is generated once (default: the mimo-pipes cache)")
    parser.add_argument("--side", choices=("mimo", "energon"), help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        child(args.side, args.path, args.samples)
        return
    from mimo_pipes.data.cache import cache_root

    folder = Path(args.cache) if args.cache else cache_root() / f"bench-energon-{VERSION}-n{args.samples}"
    started = time.perf_counter()
    build(folder, args.samples)
    size = sum(f.stat().st_size for f in folder.glob("*.tar"))
    print(f"dataset: {folder}, {args.samples} samples, {size / 2**20:.0f} MiB of shards (ready in {time.perf_counter() - started:.0f} s)")
    print(f"nproc {os.cpu_count()}, 1-minute load average {os.getloadavg()[0]:.1f} at the start, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    results = []
    for side in ("energon", "mimo"):
        out = subprocess.run([sys.executable, __file__, "--side", side, "--path", str(folder), "--samples", str(args.samples)],
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("| reader | samples | s | samples / s | peak RSS MiB (after imports) | open files (most) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['side']} | {r['samples']} | {r['seconds']:.1f} | {r['samples_per_s']:.0f} | {r['peak_rss_mb']:.0f} ({r['imported_rss_mb']:.0f}) "
              f"| {r['open_files']} |")
    print(f"1-minute load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
