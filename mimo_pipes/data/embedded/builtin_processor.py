"""The embedded processor, built offline from code: a byte-level BPE tokenizer trained in well under a second on
text from the synthetic dataset's word bank (wrapped as a transformers fast tokenizer, so it reloads with
``AutoTokenizer``) and a ``Qwen2VLImageProcessorPil`` (smart resize to multiples of 28 px, 14-px patches, temporal
patch size 2, 2x2 merge), cached under ``<cache>/processor-v2``. No download."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from mimo_pipes.data.cache import build_atomically, cache_root

PROCESSOR_VERSION = "v2"  # v2: processor_config.json names the family (Qwen2VLProcessor)
"""Bumped whenever the built-in processor changes, so a stale cached copy is never reused."""

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD)
"""Special tokens of the built-in tokenizer, with ids 0..5 in this order."""

PATCH_SIZE = 14
TEMPORAL_PATCH_SIZE = 2
MERGE_SIZE = 2
TOKEN_PIXELS = (PATCH_SIZE * MERGE_SIZE) ** 2  # pixels behind one image placeholder token: 28 x 28
MIN_PIXELS = 4 * TOKEN_PIXELS
"""Smallest resized image area (56 x 56): every image yields at least 4 placeholder tokens."""
MAX_PIXELS = 1280 * TOKEN_PIXELS
"""Largest resized image area: at most 1280 placeholder tokens per image (document pages hit this)."""

TOKENIZER_VOCAB_SIZE = 4096


def _training_corpus(num_lines: int = 4000) -> Iterator[str]:
    from mimo_pipes.data.embedded.synthetic import _PROMPTS, random_sentence

    rng = np.random.default_rng(20240501)
    prompts = [p for group in _PROMPTS.values() for p in group]
    for k in range(num_lines):
        yield random_sentence(rng, int(rng.integers(5, 40)))
        if k % 10 == 0:
            yield f"user\n{prompts[k // 10 % len(prompts)]}\nassistant\n"


def build_tokenizer():
    """Train the built-in byte-level BPE tokenizer (deterministic) and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=IM_END,
        extra_special_tokens=[t for t in SPECIAL_TOKENS if t not in (PAD_TOKEN, IM_END)],
        model_max_length=1 << 20,
    )


def build_image_processor():
    """The built-in Qwen2-VL-style image processor (PIL backend, no torchvision needed)."""
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
        patch_size=PATCH_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
        merge_size=MERGE_SIZE,
    )


def build_default_processor(path: str | Path) -> Path:
    """Build the built-in tokenizer and image processor and ``save_pretrained`` both into ``path``.

    The folder reloads with ``AutoTokenizer.from_pretrained(path)``,
    ``AutoImageProcessor.from_pretrained(path)`` and :func:`load_processor`.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save_pretrained(str(path))
    build_image_processor().save_pretrained(str(path))
    # Qwen2-VL's layout and M-RoPE, said as a downloaded folder says it (family_names.py reads it).
    (path / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2VLProcessor"}, indent=1))
    return path


def default_processor_path() -> Path:
    """The cached built-in processor folder (``<cache>/processor-v2``), built on first use."""
    return build_atomically(cache_root() / f"processor-{PROCESSOR_VERSION}", build_default_processor)
