"""Small Megatron-Energon datasets for the tests, written with webdataset's tar writer and prepared with
Energon's own preparation code (no network): the rows of :mod:`real_data` as crude samples (a ``json``
part with the LLaVA conversation, images as ``0.png``, ``1.png``, ...), and VQA / captioning samples."""

from __future__ import annotations

import json
from pathlib import Path

from real_data import image, num_images, png, turns

CRUDE_YAML = "__module__: megatron.energon\n__class__: CrudeWebdataset\n"
VQA_YAML = ("sample_type:\n  __module__: megatron.energon\n  __class__: VQASample\n"
            "field_map:\n  image: jpg\n  context: json[question]\n  answers: json[answers]\n")
CAPTION_YAML = ("sample_type:\n  __module__: megatron.energon\n  __class__: CaptioningSample\n"
                "field_map:\n  image: jpg\n  caption: txt\n")


def llava_conversation(i: int) -> list[dict]:
    """Row ``i``'s turns as :func:`real_data.write_dataset` writes its LLaVA list."""
    conversation = []
    for n, (question, reply) in enumerate(turns(i)):
        marker = "<image>\n" * num_images(i) if n == 0 else ""
        conversation += [{"from": "human", "value": marker + question}, {"from": "gpt", "value": reply}]
    return conversation


def crude_sample(i: int) -> dict:
    sample = {"__key__": f"{i:06d}", "json": json.dumps({"conversations": llava_conversation(i)}).encode()}
    sample.update({f"{k}.png": png(image(i, k)) for k in range(num_images(i))})
    return sample


def write_shards(folder: Path, samples: list[dict], per_shard: int, dataset_yaml: str, *, names: list[str] | None = None,
                 splits: dict[str, list[str]] | None = None) -> Path:
    """``samples`` (webdataset dicts: ``__key__`` and parts) written ``per_shard`` to a tar and prepared
    as an Energon dataset whose ``split.yaml`` lists the shards in order (or in the order of ``names``) as
    its ``train`` part, or (``splits``) the parts given, each with its shards in the order given."""
    import webdataset as wds
    from megatron.energon.flavors.webdataset.prepare import WebdatasetPreparator

    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for start in range(0, len(samples), per_shard):
        name = f"shard-{start // per_shard:04d}.tar"
        with wds.TarWriter(str(folder / name)) as writer:
            for sample in samples[start : start + per_shard]:
                writer.write(sample)
        shards.append(name)
    WebdatasetPreparator.prepare_dataset(folder, names or shards, split_parts_ratio=[("train", 1.0)], shuffle_seed=None, workers=1)
    (folder / ".nv-meta" / "dataset.yaml").write_text(dataset_yaml)
    if splits is not None:  # as a user edits split.yaml after energon prepare
        (folder / ".nv-meta" / "split.yaml").write_text(json.dumps({"split_parts": splits, "exclude": []}))
    return folder


def write_real_rows(folder: Path, size: int, per_shard: int = 5) -> Path:
    """The rows of :func:`real_data.write_dataset` (its LLaVA list row for row) as a crude Energon dataset."""
    return write_shards(folder, [crude_sample(i) for i in range(size)], per_shard, CRUDE_YAML)
