"""Per-sample processing: a real transformers tokenizer and image processor, the built-in one built offline.

The built-in processor is :mod:`mimo_pipes.data.embedded.builtin_processor`; a processor folder of any family of
:mod:`mimo_pipes.data.processing.families` (Qwen2/2.5/3-VL, InternVL) can be used instead (``--processor PATH``).

:class:`SampleProcessor` turns one dataset row (a conversation in any of the formats of
:mod:`mimo_pipes.data.processing.conversation`, with its images and videos) into model fields, without batch dimension
and without padding. The chat text comes from the tokenizer's (or the processor folder's) chat template;
the built-in tokenizer has none and uses the ChatML fallback of :func:`~mimo_pipes.data.processing.conversation.chatml`::

    <|im_start|>user\n<|vision_start|><|image_pad|> x n_1<|vision_end|>...{prompt}<|im_end|>\n
    <|im_start|>assistant\n{response}<|im_end|>

where ``n_i = prod(image_grid_thw[i]) / merge_size**2``. Labels follow the next-token convention:
``labels[t] = input_ids[t + 1]`` when that token belongs to an assistant turn (its reply and the
end-of-turn marker), else ``-100``; ``loss_mask[t] = 1.0`` exactly where ``labels[t] != -100``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mimo_pipes.config.flags import flag
from mimo_pipes.data import bad_rows
from mimo_pipes.data.embedded.builtin_processor import IM_END, IM_START, PAD_TOKEN, VISION_END, VISION_START
from mimo_pipes.data.paths import existing_folder
from mimo_pipes.data.processing.conversation import chatml, conversation, row_images, row_videos, template, trained_segments
from mimo_pipes.data.processing.families import family_for
from mimo_pipes.data.processing.heap import keep_freed_memory
from mimo_pipes.data.processing.media import open_image, open_video
from mimo_pipes.data.processing.truncation import FIRST_PROMPT, FIRST_REPLY, LATER, fit_to_length
from mimo_pipes.errors import ConfigError, SampleError, as_count
from mimo_pipes.observe.third_party import paused_gc, quiet_transformers
from mimo_pipes.observe.warning_tally import WarningKind, warn
from mimo_pipes.samples.handover import for_caller
from mimo_pipes.samples.sample import SAMPLE_ID

TRUNCATED = WarningKind(
    "samples truncated to --seq-length", note="later turns first, then the prompt's start and the reply's end; every image placeholder kept"
)
CONSUMED_KEYS = ("images", "image", "videos", "video", "prompt", "response", "messages", "conversations", bad_rows.ROW_PLACE)
"""Row keys a :class:`SampleProcessor` turns into model fields; every other key passes through."""

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def check_processor_path(path: str | Path) -> Path:
    """Fail with ``ConfigError('--processor', ...)`` unless ``path`` looks like a saved processor folder."""
    hint = "pass a processor folder with a tokenizer and a Qwen2-VL or InternVL (GotOcr2) image processor"
    p = existing_folder(path, "--processor", hint)
    if not any((p / f).is_file() for f in _TOKENIZER_FILES):
        raise ConfigError("--processor", f"{str(path)!r} holds no tokenizer ({' or '.join(_TOKENIZER_FILES)}); {hint}")
    if not any((p / f).is_file() for f in _IMAGE_PROCESSOR_FILES):
        raise ConfigError(
            "--processor", f"{str(path)!r} holds no image processor ({' or '.join(_IMAGE_PROCESSOR_FILES)}); {hint}"
        )
    return p


def load_processor(path: str | Path, seq_length: int, image_folder: str | None = None) -> SampleProcessor:
    """Load the tokenizer, image processor and chat template saved in ``path`` into a :class:`SampleProcessor`.

    The folder is read as its parts (``AutoTokenizer``, ``AutoImageProcessor`` with the PIL backend, the
    chat template and ``processor_config.json``), so neither torchvision nor a video backend is needed (with
    transformers 5.18 and later: 5.17's ``AutoImageProcessor`` asks for torchvision even for the PIL backend)."""
    with paused_gc():  # transformers' modules load here (see paused_gc)
        return _load_processor(path, seq_length, image_folder)


def _load_processor(path: str | Path, seq_length: int, image_folder: str | None) -> SampleProcessor:
    from transformers import AutoImageProcessor, AutoTokenizer

    seq_length = as_count(seq_length, flag("seq_length"), minimum=1)
    p = check_processor_path(path)
    with quiet_transformers():  # its advice on processors is no error; errors still raise
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(p))
        except Exception as e:  # noqa: BLE001 - any loading failure is a bad --processor
            raise ConfigError("--processor", f"cannot load a tokenizer from {str(path)!r}: {e}") from e
        try:
            image_processor = AutoImageProcessor.from_pretrained(str(p), backend="pil")
        except Exception as e:  # noqa: BLE001
            raise ConfigError("--processor", f"cannot load an image processor from {str(path)!r}: {e}") from e
    config = json.loads((p / "processor_config.json").read_text()) if (p / "processor_config.json").is_file() else {}
    chat_template = config.get("chat_template")
    if (p / "chat_template.jinja").is_file():
        chat_template = (p / "chat_template.jinja").read_text()
    elif (p / "chat_template.json").is_file():
        chat_template = json.loads((p / "chat_template.json").read_text()).get("chat_template")
    return SampleProcessor(
        tokenizer, image_processor, int(seq_length), source=str(p), chat_template=chat_template or None,
        image_folder=image_folder, processor_config=config,
    )


# ----------------------------------------------------------------------------------------------------
# The per-sample processor


class SampleProcessor:
    """Turns a dataset row into unpadded model tensors. Picklable; safe to call from several threads. Called
    in a worker process, what it returns crosses back through shared memory (:mod:`~mimo_pipes.samples.handover`).

    The row holds a conversation (``messages``, ``conversations``, or ``prompt`` and ``response``) and may
    hold ``images`` / ``image`` (PIL images, ``{"bytes", "path"}`` dicts, bytes, paths that resolve inside
    ``image_folder`` (see :mod:`mimo_pipes.data.processing.media`), HWC uint8 arrays) and ``videos`` (frames ``[T, H, W, 3]`` or lists of frames). Every
    other key (``sample_id``, ``id``, ...) is returned unchanged. A text-only sample carries no vision field.
    """

    def __init__(
        self,
        tokenizer: Any,
        image_processor: Any,
        seq_length: int,
        source: str | None = None,
        *,
        chat_template: str | None = None,
        image_folder: str | None = None,
        processor_config: dict | None = None,
    ) -> None:
        self.seq_length = int(seq_length)
        self.owner = os.getpid()  # what it returns in another (worker) process crosses back in shared memory
        keep_freed_memory()  # rows are processed in this process: freed blocks kept for the next row (heap.py)
        self.source = source
        self.image_folder = image_folder
        self.family = family_for(tokenizer, image_processor, source, processor_config or {})
        # The raw tokenizers.Tokenizer: light to pickle and never mutated, so calls are thread-safe.
        self._tokenizer = tokenizer.backend_tokenizer
        self.tokenizer = tokenizer
        template_text = chat_template or getattr(tokenizer, "chat_template", None)
        self.chat_template: str | None = template_text if isinstance(template_text, str) else None
        if self.chat_template is None:
            for token in (IM_START, IM_END):
                if self._tokenizer.token_to_id(token) is None:
                    raise ConfigError("--processor", f"the tokenizer from {source!r} has no chat template and lacks {token}")
        self.image_token_id: int = self.family.image_token_id
        self.placeholder_ids: tuple[int, ...] = self.family.placeholder_ids
        self.vision_fields = self.family.vision_fields
        pads = [re.escape(t) for t in (self.family.image_pad, self.family.video_pad) if t]
        self._pads = re.compile("(" + "|".join(pads) + ")")
        pad = getattr(tokenizer, "pad_token_id", None)
        if pad is None:
            pad = self._tokenizer.token_to_id(PAD_TOKEN)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.pad_token_id: int = int(pad) if pad is not None else int(eos or 0)
        self.im_end_id = self._tokenizer.token_to_id(IM_END)
        self.vision_start_id = self._tokenizer.token_to_id(VISION_START)
        self.vision_end_id = self._tokenizer.token_to_id(VISION_END)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        keep_freed_memory()  # a worker process processes rows with it (heap.py)

    def __repr__(self) -> str:
        return f"SampleProcessor(source={self.source!r}, family={self.family.name}, seq_length={self.seq_length})"

    @property
    def merge_size(self) -> int:
        return getattr(self.family, "merge_size", 1)

    @property
    def patch_size(self) -> int | None:
        return getattr(self.family, "patch_size", None)

    @property
    def temporal_patch_size(self) -> int | None:
        return getattr(self.family, "temporal_patch_size", None)

    def _encode(self, text: str) -> list[int]:
        # The same tokens as encode(text), but the tokenizer lets the GIL go while it works (encode holds it): with
        # many worker threads the text's tokenization was the largest wait for the GIL of a row's processing.
        return self._tokenizer.encode_batch([text], add_special_tokens=False)[0].ids

    def _render(self, turns, add_generation_prompt: bool) -> str:
        if self.chat_template is None:
            return chatml(self.family.markers)(turns, add_generation_prompt)
        return template(self.tokenizer, self.chat_template)(turns, add_generation_prompt)

    def token_layout(
        self, turns: Any, media: dict[str, list[list[int]]], sample_id: object, num_images: int, num_videos: int
    ) -> tuple[list[int], list[bool]]:
        """The sample's token ids and which of them are trained: the chat rendered with each image and video
        marker replaced by its placeholder run (``media``: pad marker -> runs in order), fitted to
        ``--seq-length`` by :func:`fit_to_length`. A sample left with no token to train on is a SampleError.
        The cost annotator and ``mimo-pipes analyze`` call it with runs computed from image sizes
        (:mod:`mimo_pipes.data.processing.module_processor`), so their counts are these."""
        markers = {self.vision_start_id, self.vision_end_id} - {None}
        ids: list[int] = []
        trained: list[bool] = []
        fixed: list[bool] = []  # placeholder runs and vision markers: never cut, never trained
        part: list[int] = []  # FIRST_PROMPT, FIRST_REPLY or LATER
        used = {pad: 0 for pad in media}
        later = False
        wrapper = getattr(self.family, "video_wrapper", None)  # Qwen3-VL: the pad's run holds the frames' own blocks
        for text, is_trained in trained_segments(turns, self._render):
            if wrapper is not None:
                text = text.replace(wrapper, self.family.video_pad)
            where = LATER if later else (FIRST_REPLY if is_trained else FIRST_PROMPT)
            later = later or is_trained
            for piece in self._pads.split(text):
                if piece in used:
                    runs = media.get(piece, [])
                    if used[piece] >= len(runs):
                        raise SampleError(sample_id, f"dataset row {sample_id}: the chat names more {piece} than the row has", field="images",
                                          kind=bad_rows.IMAGE_COUNT)
                    tokens = runs[used[piece]]
                    used[piece] += 1
                    # a placeholder run is fixed and never trained: lists made whole, not token by token (a run
                    # holds up to thousands of tokens, and rows are counted beside the training thread)
                    is_fixed, flags = [True] * len(tokens), [False] * len(tokens)
                else:
                    tokens = self._encode(piece) if piece else []
                    is_fixed = [token in markers for token in tokens]
                    flags = [is_trained and not f for f in is_fixed]
                ids.extend(tokens)
                fixed.extend(is_fixed)
                trained.extend(flags)
                part.extend([where] * len(tokens))
        if any(used[pad] != len(runs) for pad, runs in media.items()):
            raise SampleError(sample_id, f"dataset row {sample_id}: the chat template did not place every image and video", field="images",
                              kind=bad_rows.IMAGE_COUNT)

        if len(ids) > self.seq_length:
            need = sum(fixed)
            if need + 1 > self.seq_length:
                placeholders = sum(len(run) for runs in media.values() for run in runs)
                raise SampleError(
                    sample_id,
                    f"dataset row {sample_id}: needs {need + 1} tokens for its images ({placeholders} image/video "
                    f"placeholders in {num_images} images and {num_videos} videos, with their markers) and one token "
                    f"to train on, more than --seq-length {self.seq_length}",
                    field="images", kind=bad_rows.IMAGES_TOO_LONG,
                )
            kept = fit_to_length(fixed, part, self.seq_length)
            warn(TRUNCATED, sample_id, f"dataset row {sample_id}: truncated from {len(ids)} to --seq-length {self.seq_length} tokens; "
                 f"all {need} image and video tokens kept")
            ids, trained = [ids[t] for t in kept], [trained[t] for t in kept]
        if not any(trained[1:]):  # labels[t] trains token t + 1: a trained token at 0 is no label
            cut = f" after truncation to --seq-length {self.seq_length}" if len(ids) == self.seq_length else ""
            raise SampleError(sample_id, f"dataset row {sample_id}: no token to train on{cut}", field="messages", kind=bad_rows.NO_TRAINED_TOKEN)
        return ids, trained

    @bad_rows.names_place
    def __call__(self, row: dict) -> dict:
        sample_id = row.get(SAMPLE_ID, row.get("id"))
        turns = conversation(row, sample_id)
        fields: dict[str, np.ndarray] = {}
        media: dict[str, list[list[int]]] = {self.family.image_pad: []}
        images = [open_image(item, self.image_folder, sample_id, f"image {k}") for k, item in enumerate(row_images(row))]
        if images:
            feats, media[self.family.image_pad] = self.family.images(images, sample_id)
            fields.update(feats)
        videos = [open_video(item, self.image_folder, sample_id, k) for k, item in enumerate(row_videos(row))]
        if videos:
            feats, media[self.family.video_pad] = self.family.videos(videos, sample_id)
            fields.update(feats)
        ids, trained = self.token_layout(turns, media, sample_id, len(images), len(videos))
        out = {k: v for k, v in row.items() if k not in CONSUMED_KEYS}
        out.update(token_fields(ids, trained))
        for name, value in fields.items():
            out[name] = torch.from_numpy(np.ascontiguousarray(value))
        return for_caller(out, self.owner)


def token_fields(ids: Any, trained: Any) -> dict[str, torch.Tensor]:
    """The token fields of a sample from its token ids and which of them are trained (lists or 1-d
    tensors; see the module doc)."""
    input_ids = _as_tensor(ids, np.int64, torch.int64)
    length = input_ids.shape[0]
    trained_mask = _as_tensor(trained, np.bool_, torch.bool)
    labels = torch.full((length,), -100, dtype=torch.int64)
    labels[:-1] = torch.where(trained_mask[1:], input_ids[1:], labels[:-1])
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones(length, dtype=torch.int64),
        "labels": labels,
        "loss_mask": (labels != -100).to(torch.float32),
        "position_ids": torch.arange(length, dtype=torch.int64),
    }


def _as_tensor(values: Any, np_dtype: Any, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.to(dtype)
    return torch.from_numpy(np.asarray(values, dtype=np_dtype))  # several times faster than torch.tensor(list)
