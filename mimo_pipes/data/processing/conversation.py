"""Dataset rows as conversations, and conversations as text segments that are trained or not.

Three row formats are read (the first one a row has wins):

* ``messages``: ``[{"role": ..., "content": ...}]``; content a string or a list of ``{"type": "text",
  "text": ...}``, ``{"type": "image"}`` and ``{"type": "video"}`` parts;
* ``conversations`` (LLaVA): ``[{"from": "human" | "gpt" | "system", "value": ...}]`` with ``<image>`` and
  ``<video>`` markers in the text;
* ``prompt`` / ``response``: one user turn (images first, then the prompt) and one assistant turn.

Images come from the row's ``images`` (or ``image``) column in order of their parts; a row whose parts
name no image while it has images gets them at the start of its first user turn.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mimo_pipes.data import bad_rows
from mimo_pipes.data.processing.media import as_list
from mimo_pipes.errors import SampleError

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system", "bot": "assistant"}
_MARKERS = re.compile(r"(<image>|<video>)")


@dataclass(frozen=True)
class Turn:
    role: str  # user, assistant or system
    parts: tuple[tuple[str, str], ...]  # ("text", text) | ("image", "") | ("video", "")


def row_images(row: dict) -> list:
    """The row's ``images``, else its ``image`` (a column a row lacks reads as None from a dataset that has it)."""
    return as_list(row["images"] if row.get("images") is not None else row.get("image"))


def row_videos(row: dict) -> list:
    return as_list(row["videos"] if row.get("videos") is not None else row.get("video"))


def conversation(row: dict, sample: object) -> list[Turn]:
    """The row's turns; SampleError naming the dataset row when it holds no usable conversation."""
    fault = row.get(bad_rows.ROW_FAULT)
    if fault is not None:  # a row its source could not read
        raise SampleError(sample, f"dataset row {sample}: {fault['reason']}", kind=fault["kind"])
    if row.get("messages") is not None:
        turns = [_message_turn(k, m, sample) for k, m in enumerate(_turn_list(row, "messages", sample))]
    elif row.get("conversations") is not None:
        turns = [_llava_turn(m, sample) for m in _turn_list(row, "conversations", sample)]
    elif row.get("prompt") is not None or row.get("response") is not None:
        prompt, response = row.get("prompt") or "", row.get("response") or ""
        if not isinstance(prompt, str) or not isinstance(response, str):
            raise SampleError(sample, f"dataset row {sample}: prompt and response must be strings", field="prompt",
                              kind=bad_rows.MALFORMED_CONVERSATION)
        turns = [Turn("user", (("text", prompt),)), Turn("assistant", (("text", response),))]
    else:
        raise SampleError(sample, f"dataset row {sample}: no text (needs messages, conversations, or prompt and response)", field="messages",
                          kind=bad_rows.NO_CONVERSATION)
    if not any(turn.role == "assistant" and _text(turn) for turn in turns):
        raise SampleError(sample, f"dataset row {sample}: no assistant text to train on", field="messages", kind=bad_rows.NO_REPLY)
    return _place_media(turns, len(row_images(row)), len(row_videos(row)), sample)


def _text(turn: Turn) -> str:
    return "".join(value for kind, value in turn.parts if kind == "text")


def _turn_list(row: dict, column: str, sample: object) -> list:
    turns = row[column]
    if not isinstance(turns, (list, tuple)):
        raise SampleError(sample, f"dataset row {sample}: {column} must be a list of turns, got {type(turns).__name__} {turns!r:.40}", field=column,
                          kind=bad_rows.MALFORMED_CONVERSATION)
    return list(turns)


def _message_turn(index: int, message: Any, sample: object) -> Turn:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise SampleError(sample, f"dataset row {sample}: a message needs a role of {sorted(set(ROLES))}, got {message!r:.80}", field="messages",
                          kind=bad_rows.MALFORMED_CONVERSATION)
    content = message.get("content")
    if content is None or isinstance(content, str):
        return Turn(ROLES[message["role"]], _split_markers(content or ""))
    if not isinstance(content, (list, tuple)):
        raise SampleError(sample, f"dataset row {sample}: message {index}: content must be a string or a list of parts, got "
                                  f"{type(content).__name__} {content!r:.40}", field="messages", kind=bad_rows.MALFORMED_CONVERSATION)
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            text = part.get("text")
            if text is not None and not isinstance(text, str):
                raise SampleError(sample, f"dataset row {sample}: message {index}: text must be a string, got "
                                          f"{type(text).__name__} {text!r:.40}", field="messages", kind=bad_rows.MALFORMED_CONVERSATION)
            parts.append(("text", text or ""))
        elif kind in ("image", "video"):
            parts.append((kind, ""))
        else:
            raise SampleError(sample, f"dataset row {sample}: content part {part!r:.80} is not text, image or video", field="messages",
                              kind=bad_rows.MALFORMED_CONVERSATION)
    return Turn(ROLES[message["role"]], tuple(parts))


def _llava_turn(message: Any, sample: object) -> Turn:
    if not isinstance(message, dict) or message.get("from") not in ROLES or not isinstance(message.get("value"), str):
        raise SampleError(sample, f"dataset row {sample}: a conversation turn needs 'from' and a string 'value', got {message!r:.80}",
                          field="conversations", kind=bad_rows.MALFORMED_CONVERSATION)
    return Turn(ROLES[message["from"]], _split_markers(message["value"]))


def _split_markers(text: str) -> tuple[tuple[str, str], ...]:
    parts = []
    for piece in _MARKERS.split(text):
        if piece == "<image>":
            parts.append(("image", ""))
        elif piece == "<video>":
            parts.append(("video", ""))
        elif piece:
            parts.append(("text", piece.strip("\n") if parts and parts[-1][0] != "text" else piece))
    return tuple(p for p in parts if p != ("text", ""))


def _place_media(turns: list[Turn], images: int, videos: int, sample: object) -> list[Turn]:
    for kind, have in (("image", images), ("video", videos)):
        named = sum(1 for t in turns for k, _ in t.parts if k == kind)
        if named == 0 and have:
            first = next((i for i, t in enumerate(turns) if t.role == "user"), None)
            if first is None:
                raise SampleError(sample, f"dataset row {sample}: {have} {kind}s but no user turn to hold them", field=f"{kind}s",
                                  kind=bad_rows.IMAGE_COUNT)
            turn = turns[first]
            turns[first] = Turn(turn.role, ((kind, ""),) * have + turn.parts)
        elif named != have:
            raise SampleError(sample, f"dataset row {sample}: the conversation names {named} {kind}s but the row has {have}", field=f"{kind}s",
                              kind=bad_rows.IMAGE_COUNT)
    return turns


# ----------------------------------------------------------------------------------------------------
# Rendering


Render = Callable[[list[Turn], bool], str]
"""``render(turns, add_generation_prompt)``: the chat text, media as the family's marker text."""


def trained_segments(turns: list[Turn], render: Render) -> list[tuple[str, bool]]:
    """The chat text cut into (text, trained) pieces: each assistant turn's reply and its end-of-turn
    marker are trained (trailing whitespace excepted); everything else is not."""
    full = render(turns, False)
    segments: list[tuple[str, bool]] = []
    pos = 0
    for k, turn in enumerate(turns):
        if turn.role != "assistant":
            continue
        start = len(render(turns[:k], True)) if k else 0
        end = len(render(turns[: k + 1], False).rstrip())
        if not full.startswith(render(turns[: k + 1], False)) or start < pos or end < start:
            raise ValueError("the chat template does not render conversations as growing prefixes")
        segments += [(full[pos:start], False), (full[start:end], True)]
        pos = end
    segments.append((full[pos:], False))
    return [(text, trained) for text, trained in segments if text]


def chatml(marker: dict[str, str]) -> Render:
    """The fallback chat format for tokenizers without a chat template (the built-in one's)::

        <|im_start|>{role}\\n{content}<|im_end|>   (turns joined by a newline)

    with each image or video part written as ``marker[kind]``."""

    def render(turns: list[Turn], add_generation_prompt: bool) -> str:
        text = "\n".join(
            f"<|im_start|>{t.role}\n" + "".join(v if k == "text" else marker[k] for k, v in t.parts) + "<|im_end|>" for t in turns
        )
        if add_generation_prompt:
            text += ("\n" if turns else "") + "<|im_start|>assistant\n"
        return text

    return render


def template(tokenizer: Any, chat_template: str) -> Render:
    """Render with a Jinja chat template (the tokenizer's or the processor folder's own)."""

    def render(turns: list[Turn], add_generation_prompt: bool) -> str:
        messages = [
            {"role": t.role, "content": [{"type": k, "text": v} if k == "text" else {"type": k} for k, v in t.parts]} for t in turns
        ]
        if not messages:
            return ""
        return tokenizer.apply_chat_template(
            messages, chat_template=chat_template, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    return render
