"""Energon samples as conversation rows: what a prepared dataset's ``dataset.yaml`` says its samples are,
and one sample's tar members (``{part name: bytes}``) turned into the row the graph reads.

Three kinds of ``dataset.yaml`` are read:

* ``VQASample`` (``sample_type``, or the older ``__class__: VQAWebdataset``) with a ``field_map``: one user
  turn holding the image, then ``context``; one assistant turn holding the first of ``answers`` (a string
  is one answer);
* ``CaptioningSample`` (or ``CaptioningWebdataset``) with a ``field_map``: one user turn holding the image;
  one assistant turn holding ``caption``;
* ``CrudeWebdataset``: the sample's ``json`` part holds ``conversations`` (LLaVA turns with ``<image>``
  markers) or ``messages`` (the chat format of :mod:`~mimo_pipes.data.processing.conversation`); its images are the
  parts that its optional ``images`` list names, in that order, else every image part (``jpg``, ``png``,
  ``0.jpg``, ``1.jpg``, ...) in the natural order of their names.

A ``field_map`` entry is Energon's: ``part`` or ``part[key][key]``, options separated by commas. A ``json``
part is parsed, a ``txt`` part read as UTF-8 text; an image part is kept as its encoded bytes, as
``{"bytes", "path": "<shard>/<key>.<part>"}``: nothing is decoded here. A sample that does not fit its
kind raises :class:`UnfitSample` with the reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from mimo_pipes.errors import ConfigError

IMAGE_PARTS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm"})
KINDS = {
    "VQASample": "vqa", "VQAWebdataset": "vqa",
    "CaptioningSample": "captioning", "CaptioningWebdataset": "captioning",
    "CrudeSample": "crude", "CrudeWebdataset": "crude",
}
SUPPORTED = "VQASample, CaptioningSample (with a field_map) or CrudeWebdataset"
REQUIRED_FIELDS = {"vqa": ("image", "context", "answers"), "captioning": ("image", "caption")}


class UnfitSample(ValueError):
    """A sample whose parts do not make a conversation of its kind; the message is the reason."""


@dataclass(frozen=True)
class SampleKind:
    """What a dataset's samples are: ``kind`` (vqa, captioning or crude) and, for the first two, the
    ``field_map`` (field -> access options, as Energon splits them)."""

    kind: str
    field_map: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = ()

    @property
    def parts(self) -> frozenset[str] | None:
        """The parts a sample is read for (None: all of them)."""
        if self.kind == "crude":
            return None
        return frozenset(option[0] for _, options in self.field_map for option in options)


def sample_kind(config: dict, where: str) -> SampleKind:
    """The kind a parsed ``dataset.yaml`` (``config``, read from ``where``) declares; ConfigError naming
    the file for any other."""
    from megatron.energon.flavors.webdataset.field_access import split_field_access

    declared = config.get("sample_type")
    name = declared.get("__class__") if isinstance(declared, dict) else config.get("__class__")
    kind = KINDS.get(str(name))
    if kind is None:
        raise ConfigError("--dataset", f"{where} declares samples of type {name!r}; mimo-pipes reads {SUPPORTED}")
    if kind == "crude":
        return SampleKind(kind)
    if config.get("sample_loader") is not None:
        raise ConfigError("--dataset", f"{where}: a {name} dataset is read through its field_map (a sample_loader is not supported)")
    if not isinstance(config.get("field_map"), dict):
        raise ConfigError("--dataset", f"{where}: a {name} dataset needs a field_map naming the parts of {', '.join(REQUIRED_FIELDS[kind])}")
    fields = {str(k): v for k, v in config["field_map"].items()}
    missing = [field for field in REQUIRED_FIELDS[kind] if field not in fields]
    if missing:
        raise ConfigError("--dataset", f"{where}: the field_map lacks {', '.join(missing)}")
    mapped = tuple(sorted((field, tuple(tuple(option) for option in split_field_access(str(spec)))) for field, spec in fields.items()))
    return SampleKind(kind, mapped)


def sample_row(kind: SampleKind, parts: dict[str, bytes], shard: str, key: str) -> dict:
    """The conversation row of one sample (its parts by name); UnfitSample when they do not make one."""
    if kind.kind == "crude":
        return _crude_row(parts, shard, key)
    fields = _fields(kind, parts, shard, key)
    image = fields["image"]
    if not isinstance(image, dict):
        raise UnfitSample(f"the image field maps to {type(image).__name__}, not an image part")
    if kind.kind == "vqa":
        context, answers = fields["context"], fields["answers"]
        answer = answers if isinstance(answers, str) else (answers[0] if isinstance(answers, list) and answers else None)
        if not isinstance(context, str) or not isinstance(answer, str):
            raise UnfitSample("a VQA sample needs a text context and at least one text answer")
        user = [{"type": "image"}] + ([{"type": "text", "text": context}] if context else [])
        reply = answer
    else:
        caption = fields["caption"]
        if not isinstance(caption, str):
            raise UnfitSample(f"the caption is {type(caption).__name__}, not text")
        user, reply = [{"type": "image"}], caption
    return {"images": [image], "messages": [
        {"role": "user", "content": user}, {"role": "assistant", "content": [{"type": "text", "text": reply}]}]}


def _fields(kind: SampleKind, parts: dict[str, bytes], shard: str, key: str) -> dict[str, Any]:
    from megatron.energon.flavors.webdataset.field_access import field_access

    decoded = {name: _decoded(name, parts[name], shard, key) for name in kind.parts or () if name in parts}
    fields = {}
    for field, options in kind.field_map:
        try:
            fields[field] = field_access(decoded, [list(option) for option in options])
        except Exception as error:  # noqa: BLE001 - a missing part or key: the sample's fault
            raise UnfitSample(f"field {field!r}: {' '.join(str(error).split())[:200]}") from None
    return fields


def field_errors(kind: SampleKind, samples: list[tuple[str, dict[str, bytes]]]) -> list[tuple[str, str, str]]:
    """(field, its field_map entry, why) of every ``field_map`` field that none of ``samples`` (``(key,
    parts)`` pairs) has."""
    from megatron.energon.flavors.webdataset.field_access import field_access

    failing: dict[str, str] = {}
    found: set[str] = set()
    for key, parts in samples:
        try:
            decoded = {name: _decoded(name, parts[name], "", key) for name in kind.parts or () if name in parts}
        except UnfitSample:
            continue
        for field, options in kind.field_map:
            try:
                field_access(decoded, [list(option) for option in options])
                found.add(field)
            except Exception as error:  # noqa: BLE001 - a missing part or key
                failing.setdefault(field, f"{type(error).__name__}: {' '.join(str(error).split())[:120]}")
    return [(field, field_spec(options), failing[field]) for field, options in kind.field_map if field in failing and field not in found]


def field_spec(options: tuple[tuple[str, ...], ...]) -> str:
    """A field_map entry as ``dataset.yaml`` writes it: ``part[key][key]``, options separated by commas."""
    return ",".join(option[0] + "".join(f"[{key}]" for key in option[1:]) for option in options)


def _decoded(name: str, raw: bytes, shard: str, key: str) -> Any:
    ext = name.rsplit(".", 1)[-1].lower()
    if ext in IMAGE_PARTS:
        return {"bytes": raw, "path": f"{shard}/{key}.{name}"}
    if ext == "json":
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise UnfitSample(f"part {name!r} is not valid JSON ({error})") from None
    if ext in ("txt", "text"):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise UnfitSample(f"part {name!r} is not UTF-8 text ({error.reason})") from None
    return raw


def _natural(name: str) -> tuple:
    return tuple(int(piece) if piece.isdigit() else piece for piece in re.split(r"(\d+)", name))


def _crude_row(parts: dict[str, bytes], shard: str, key: str) -> dict:
    if "json" not in parts:
        raise UnfitSample(f"a crude sample needs a json part with its conversation (has {', '.join(sorted(parts)) or 'no parts'})")
    value = _decoded("json", parts["json"], shard, key)
    if not isinstance(value, dict) or not (isinstance(value.get("conversations"), list) or isinstance(value.get("messages"), list)):
        raise UnfitSample("the json part must be an object with a conversations or messages list")
    named = value.get("images")
    if named is None:
        names = sorted((name for name in parts if name.rsplit(".", 1)[-1].lower() in IMAGE_PARTS), key=_natural)
    elif isinstance(named, list) and all(isinstance(name, str) for name in named):
        absent = [name for name in named if name not in parts]
        if absent:
            raise UnfitSample(f"the json part names image part(s) {', '.join(map(repr, absent))} the sample lacks")
        names = list(named)
    else:
        raise UnfitSample("the json part's images must be a list of part names")
    row = {"images": [{"bytes": parts[name], "path": f"{shard}/{key}.{name}"} for name in names]}
    column = "conversations" if isinstance(value.get("conversations"), list) else "messages"
    row[column] = value[column]
    return row
