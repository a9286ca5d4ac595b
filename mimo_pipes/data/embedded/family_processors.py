"""Tiny processor folders of each supported family, built offline (for tests, docs and trying things out).

Each folder holds what a real one does for this library: a tokenizer (the built-in BPE vocabulary plus
the family's special tokens and, for the Qwen families, a Qwen-style chat template), an image processor
config and ``processor_config.json``. Load it with :func:`~mimo_pipes.data.processing.processor.load_processor`
or ``--processor``, as a downloaded one.
"""

from __future__ import annotations

import json
from pathlib import Path

FAMILIES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl", "internvl")
PROCESSOR_CLASSES = {
    "qwen2-vl": "Qwen2VLProcessor",
    "qwen2.5-vl": "Qwen2_5_VLProcessor",
    "qwen3-vl": "Qwen3VLProcessor",
    "internvl": "InternVLProcessor",
}
EXTRA_TOKENS = ("<|video_pad|>", "<img>", "</img>", "<IMG_CONTEXT>")
QWEN_CHAT_TEMPLATE = (
    "{% if messages and messages[0].role != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c.type == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% else %}{{ c.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
INTERNVL_IMAGE_SEQ_LENGTH = 4
"""Placeholder tokens per tile of the tiny InternVL folder (256 in the real models)."""


def build_family_processor(path: str | Path, family: str, *, tile_size: int = 28) -> Path:
    """Write a tiny ``family`` processor folder (one of :data:`FAMILIES`) into ``path``."""
    from transformers import AutoTokenizer, GotOcr2ImageProcessorPil, Qwen2VLImageProcessorPil

    from mimo_pipes.data.embedded.builtin_processor import default_processor_path

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(default_processor_path()))  # the built-in one, trained once and cached
    tokenizer.add_tokens(list(EXTRA_TOKENS), special_tokens=True)
    config: dict = {"processor_class": PROCESSOR_CLASSES[family]}
    if family == "internvl":
        image_processor = GotOcr2ImageProcessorPil(
            size={"height": tile_size, "width": tile_size}, crop_to_patches=True, min_patches=1, max_patches=4
        )
        config["image_seq_length"] = INTERNVL_IMAGE_SEQ_LENGTH
    else:
        patch = 16 if family == "qwen3-vl" else 14
        factor = patch * 2
        image_processor = Qwen2VLImageProcessorPil(
            patch_size=patch, temporal_patch_size=2, merge_size=2,
            min_pixels=4 * factor * factor, max_pixels=64 * factor * factor,
        )
        tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(path))
    image_processor.save_pretrained(str(path))
    (path / "processor_config.json").write_text(json.dumps(config, indent=1))
    return path
