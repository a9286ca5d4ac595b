"""Which Qwen-VL release a patch processor folder belongs to: Qwen2-VL, Qwen2.5-VL and Qwen3-VL share one image
processor class (``Qwen2VLImageProcessor*``) and lay out images alike, but their M-RoPE steps video time
differently (see :mod:`mimo_pipes.megatron.rope`), so the release is read from what the folder says of itself:

* ``processor_class`` (``Qwen2_5_VLProcessor``, ...) in ``processor_config.json``, ``preprocessor_config.json``
  or ``tokenizer_config.json``, as transformers' ``save_pretrained`` writes it;
* ``video_processor_type`` in ``video_preprocessor_config.json``, for Qwen3-VL alone (``Qwen3VLVideoProcessor`` is
  its own; Qwen2.5-VL's folders name Qwen2-VL's video processor, so that name tells the two apart not at all);
* ``model_type`` in ``config.json`` (a folder saved with its model).

Unknown (None) when none of them names a release: the caller decides whether that matters (images do not
differ, videos do).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

QWEN2_VL, QWEN2_5_VL, QWEN3_VL = "qwen2-vl", "qwen2.5-vl", "qwen3-vl"
# Each release's class and model-type prefixes, longest first where one prefixes another (Qwen2_5 before Qwen2).
_PREFIXES = (
    (QWEN3_VL, ("Qwen3VL", "Qwen3_VL", "qwen3_vl")),
    (QWEN2_5_VL, ("Qwen2_5_VL", "Qwen2.5VL", "qwen2_5_vl")),
    (QWEN2_VL, ("Qwen2VL", "Qwen2_VL", "qwen2_vl")),
)
_ANY = (QWEN2_VL, QWEN2_5_VL, QWEN3_VL)
_SOURCES = (  # file, key, the releases its value may tell
    ("processor_config.json", "processor_class", _ANY),
    ("preprocessor_config.json", "processor_class", _ANY),
    ("tokenizer_config.json", "processor_class", _ANY),
    ("video_preprocessor_config.json", "video_processor_type", (QWEN3_VL,)),
    ("config.json", "model_type", _ANY),
)


def release_of(name: object) -> str | None:
    """The release a class name or model type names (``Qwen2_5_VLProcessor`` -> ``qwen2.5-vl``), else None."""
    if not isinstance(name, str):
        return None
    for release, prefixes in _PREFIXES:
        if name.startswith(prefixes):
            return release
    return None


def folder_release(folder: Path | None, processor_config: Mapping[str, object]) -> str | None:
    """The release a processor folder names (see the module doc), ``processor_config`` (its
    ``processor_config.json``, or what a caller passes instead) first; None when nothing names one."""
    found = release_of(processor_config.get("processor_class"))
    if found is not None or folder is None:
        return found
    for file, key, tells in _SOURCES:
        path = Path(folder) / file
        if not path.is_file():
            continue
        try:
            found = release_of(json.loads(path.read_text()).get(key))
        except (ValueError, OSError, AttributeError):  # unreadable or not an object: it names nothing
            continue
        if found in tells:
            return found
    return None
