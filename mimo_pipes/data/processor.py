"""Per-sample processing: a real transformers tokenizer and Qwen2-VL-style image processor, built offline.

The built-in processor is made from scratch, without any download: a byte-level BPE tokenizer trained in
well under a second on text from the synthetic dataset's word bank (wrapped as a transformers fast
tokenizer, so it reloads with ``AutoTokenizer``) and a ``Qwen2VLImageProcessorPil`` (smart resize to
multiples of 28 px, 14-px patches, temporal patch size 2, 2x2 merge). Any folder written by
``save_pretrained`` that holds a tokenizer with the Qwen2-VL chat and vision tokens and a Qwen2-VL-style
image processor can be used instead (``--processor PATH``).

:class:`SampleProcessor` turns one dataset row (``images``, ``prompt``, ``response``) into model fields,
without batch dimension and without padding::

    <|im_start|>user\\n
    <|vision_start|><|image_pad|> x n_1 <|vision_end|> ... one group per image
    {prompt}<|im_end|>\\n<|im_start|>assistant\\n
    {response}<|im_end|>

where ``n_i = prod(image_grid_thw[i]) / merge_size**2``. Labels follow the next-token convention:
``labels[t] = input_ids[t + 1]`` when that token is part of the response (the response text and its
closing ``<|im_end|>``), else ``-100``; ``loss_mask[t] = 1.0`` exactly where ``labels[t] != -100``.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mimo_pipes.cost import image_token_count as count_image_tokens  # noqa: F401 - re-exported
from mimo_pipes.data.cache import build_atomically, cache_root
from mimo_pipes.data.paths import existing_folder
from mimo_pipes.errors import ConfigError, SampleError
from mimo_pipes.sample import SAMPLE_ID

logger = logging.getLogger(__name__)

PROCESSOR_VERSION = "v1"
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
CONSUMED_KEYS = ("images", "prompt", "response")
"""Row keys a :class:`SampleProcessor` turns into model fields; every other key passes through."""

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


# ----------------------------------------------------------------------------------------------------
# Building the default processor


def _training_corpus(num_lines: int = 4000) -> Iterator[str]:
    from mimo_pipes.data.synthetic import _PROMPTS, random_sentence

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
    return path


def default_processor_path() -> Path:
    """The cached built-in processor folder (``<cache>/processor-v1``), built on first use."""
    return build_atomically(cache_root() / f"processor-{PROCESSOR_VERSION}", build_default_processor)


def check_processor_path(path: str | Path) -> Path:
    """Fail with ``ConfigError('--processor', ...)`` unless ``path`` looks like a saved processor folder."""
    hint = "pass a folder written by save_pretrained with a tokenizer and a Qwen2-VL-style image processor"
    p = existing_folder(path, "--processor", hint)
    if not any((p / f).is_file() for f in _TOKENIZER_FILES):
        raise ConfigError("--processor", f"{str(path)!r} holds no tokenizer ({' or '.join(_TOKENIZER_FILES)}); {hint}")
    if not any((p / f).is_file() for f in _IMAGE_PROCESSOR_FILES):
        raise ConfigError(
            "--processor", f"{str(path)!r} holds no image processor ({' or '.join(_IMAGE_PROCESSOR_FILES)}); {hint}"
        )
    return p


def load_processor(path: str | Path, seq_length: int) -> SampleProcessor:
    """Load the tokenizer and image processor saved in ``path`` into a :class:`SampleProcessor`."""
    from transformers import AutoImageProcessor, AutoTokenizer

    if isinstance(seq_length, bool) or not isinstance(seq_length, (int, np.integer)) or seq_length < 1:
        raise ConfigError("--seq-length", f"must be a positive integer, got {seq_length!r}")
    p = check_processor_path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(p))
    except Exception as e:  # noqa: BLE001 - any loading failure is a bad --processor
        raise ConfigError("--processor", f"cannot load a tokenizer from {str(path)!r}: {e}") from e
    try:
        image_processor = AutoImageProcessor.from_pretrained(str(p), backend="pil")
    except Exception as e:  # noqa: BLE001
        raise ConfigError("--processor", f"cannot load an image processor from {str(path)!r}: {e}") from e
    return SampleProcessor(tokenizer, image_processor, int(seq_length), source=str(p))


# ----------------------------------------------------------------------------------------------------
# The per-sample processor


def _split_budget(prompt_len: int, response_len: int, budget: int) -> tuple[int, int]:
    """How many prompt and response tokens to keep within ``budget``; a long side gives way first."""
    if prompt_len + response_len <= budget:
        return prompt_len, response_len
    keep_r = min(response_len, max(budget - prompt_len, budget // 2))
    keep_p = min(prompt_len, budget - keep_r)
    return keep_p, keep_r


class SampleProcessor:
    """Turns a dataset row into unpadded model tensors. Picklable; safe to call from several threads.

    ``row`` must hold ``prompt`` and ``response`` (strings) and may hold ``images`` (a list of PIL images,
    ``{"bytes", "path"}`` dicts, raw bytes, file paths or HWC uint8 arrays; missing, ``None`` or empty
    for a text-only sample). Every other key (``sample_id``, ``id``, ...) is returned unchanged.
    """

    def __init__(self, tokenizer: Any, image_processor: Any, seq_length: int, source: str | None = None) -> None:
        self.seq_length = int(seq_length)
        self.source = source
        self.image_processor = image_processor
        # The raw tokenizers.Tokenizer: light to pickle and never mutated, so calls are thread-safe.
        self._tokenizer = tokenizer.backend_tokenizer
        ids = {}
        missing = []
        for tok in (IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD):
            tid = self._tokenizer.token_to_id(tok)
            if tid is None:
                missing.append(tok)
            ids[tok] = tid
        if missing:
            raise ConfigError("--processor", f"the tokenizer from {source!r} lacks the tokens {', '.join(missing)}")
        self.image_token_id: int = ids[IMAGE_PAD]
        self.vision_start_id: int = ids[VISION_START]
        self.vision_end_id: int = ids[VISION_END]
        self.im_end_id: int = ids[IM_END]
        pad = getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            pad = self._tokenizer.token_to_id(PAD_TOKEN)
        self.pad_token_id: int = int(pad) if pad is not None else self.im_end_id
        for attr in ("patch_size", "temporal_patch_size", "merge_size"):
            if not isinstance(getattr(image_processor, attr, None), int):
                raise ConfigError(
                    "--processor",
                    f"the image processor from {source!r} ({type(image_processor).__name__}) is not Qwen2-VL-style: "
                    f"no integer {attr}",
                )
        self.patch_size: int = image_processor.patch_size
        self.temporal_patch_size: int = image_processor.temporal_patch_size
        self.merge_size: int = image_processor.merge_size
        self.patch_dim: int = 3 * self.temporal_patch_size * self.patch_size**2
        self._head = self._encode(f"{IM_START}user\n")
        self._middle = self._encode(f"{IM_END}\n{IM_START}assistant\n")
        self._tail = [self.im_end_id]

    def __repr__(self) -> str:
        return f"SampleProcessor(source={self.source!r}, seq_length={self.seq_length})"

    def _encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def template_tokens(self, num_images: int) -> int:
        """Tokens every sample with ``num_images`` images needs besides prompt, response and placeholders."""
        return len(self._head) + len(self._middle) + len(self._tail) + 2 * num_images

    # -- row decoding --

    @staticmethod
    def _text(row: dict, key: str, sample_id: object) -> str:
        if key not in row:
            raise SampleError(sample_id, f"the row has no {key!r} column", field=key)
        value = row[key]
        if value is None:
            return ""
        if not isinstance(value, str):
            raise SampleError(sample_id, f"expected a string, got {type(value).__name__}", field=key)
        return value

    @staticmethod
    def _images(value: Any, sample_id: object) -> list:
        from PIL import Image

        if value is None:
            return []
        if not isinstance(value, (list, tuple)):
            value = [value]
        out = []
        for k, item in enumerate(value):
            try:
                if isinstance(item, Image.Image):
                    img = item
                elif isinstance(item, dict) and item.get("bytes") is not None:
                    img = Image.open(io.BytesIO(item["bytes"]))
                elif isinstance(item, dict) and item.get("path"):
                    img = Image.open(item["path"])
                elif isinstance(item, (bytes, bytearray)):
                    img = Image.open(io.BytesIO(bytes(item)))
                elif isinstance(item, (str, Path)):
                    img = Image.open(item)
                elif isinstance(item, np.ndarray):
                    img = Image.fromarray(item)
                else:
                    raise TypeError(f"unsupported image type {type(item).__name__}")
                img.load()
            except Exception as e:  # noqa: BLE001 - any decode failure names the sample
                raise SampleError(sample_id, f"image {k} cannot be decoded: {e}", field="images") from e
            out.append(img)
        return out

    # -- the call --

    def __call__(self, row: dict) -> dict:
        sample_id = row.get(SAMPLE_ID, row.get("id"))
        prompt = self._text(row, "prompt", sample_id)
        response = self._text(row, "response", sample_id)
        images = self._images(row.get("images"), sample_id)

        merge2 = self.merge_size**2
        if images:
            try:
                feats = self.image_processor(images=images, return_tensors="np")
            except Exception as e:  # noqa: BLE001
                raise SampleError(sample_id, f"the image processor failed: {e}", field="images") from e
            pixel_values = np.ascontiguousarray(feats["pixel_values"], dtype=np.float32)
            grid = np.asarray(feats["image_grid_thw"], dtype=np.int64).reshape(-1, 3)
            patches = grid.prod(axis=1)
            if grid.shape[0] != len(images) or pixel_values.shape[0] != int(patches.sum()) or np.any(patches % merge2):
                raise SampleError(
                    sample_id,
                    f"the image processor returned {pixel_values.shape[0]} patch rows and grids {grid.tolist()} "
                    f"for {len(images)} images",
                    field="images",
                )
            per_image = (patches // merge2).tolist()
        else:
            pixel_values = np.zeros((0, self.patch_dim), dtype=np.float32)
            grid = np.zeros((0, 3), dtype=np.int64)
            per_image = []

        num_image_tokens = int(sum(per_image))
        fixed = self.template_tokens(len(images)) + num_image_tokens
        if fixed > self.seq_length:
            raise SampleError(
                sample_id,
                f"needs {fixed} tokens for its images ({num_image_tokens} image placeholders in "
                f"{len(images)} images, plus chat markers), more than --seq-length {self.seq_length}",
                field="images",
            )

        prompt_ids = self._encode(prompt)
        response_ids = self._encode(response)
        keep_p, keep_r = _split_budget(len(prompt_ids), len(response_ids), self.seq_length - fixed)
        if keep_p < len(prompt_ids) or keep_r < len(response_ids):
            logger.warning(
                "sample %r: text truncated to fit --seq-length %d: prompt %d -> %d tokens, response %d -> %d "
                "tokens; all %d image tokens kept",
                sample_id,
                self.seq_length,
                len(prompt_ids),
                keep_p,
                len(response_ids),
                keep_r,
                num_image_tokens,
            )

        ids: list[int] = list(self._head)
        for n in per_image:
            ids.append(self.vision_start_id)
            ids.extend([self.image_token_id] * n)
            ids.append(self.vision_end_id)
        ids.extend(prompt_ids[:keep_p])
        ids.extend(self._middle)
        trained_from = len(ids)
        ids.extend(response_ids[:keep_r])
        ids.extend(self._tail)

        input_ids = torch.tensor(ids, dtype=torch.int64)
        length = input_ids.shape[0]
        trained = torch.zeros(length, dtype=torch.bool)
        trained[trained_from:] = True
        labels = torch.full((length,), -100, dtype=torch.int64)
        labels[:-1] = torch.where(trained[1:], input_ids[1:], labels[:-1])

        out = {k: v for k, v in row.items() if k not in CONSUMED_KEYS}
        out.update(
            input_ids=input_ids,
            attention_mask=torch.ones(length, dtype=torch.int64),
            labels=labels,
            loss_mask=(labels != -100).to(torch.float32),
            position_ids=torch.arange(length, dtype=torch.int64),
            pixel_values=torch.from_numpy(pixel_values),
            image_grid_thw=torch.from_numpy(np.ascontiguousarray(grid)),
        )
        return out

