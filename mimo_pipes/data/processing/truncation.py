"""Fitting a sample to ``--seq-length``: which tokens a sample longer than the length keeps."""

from __future__ import annotations

FIRST_PROMPT, FIRST_REPLY, LATER = 0, 1, 2
"""Where a token lies: before the first assistant reply, in it, or after it (later turns)."""


def share_room(prompt: int, reply: int, room: int) -> tuple[int, int]:
    """(prompt, reply) tokens kept of ``prompt`` and ``reply`` in ``room`` tokens: the longer gives way
    first, and each keeps at least half of the room (the reply the odd token) when both are long."""
    if prompt + reply <= room:
        return prompt, reply
    half = room // 2
    if prompt <= half:
        return prompt, room - prompt
    if reply <= room - half:
        return room - reply, reply
    return half, room - half


def fit_to_length(fixed: list[bool], part: list[int], length: int) -> list[int]:
    """The positions kept of a sample longer than ``length`` (``sum(fixed) < length``), in order.

    ``fixed`` tokens (image and video placeholders with their markers) are all kept. Of the others, the
    turns after the first reply give way first, cut at their end; when the first exchange still does not
    fit, its prompt and its reply share the room (:func:`share_room`): the prompt loses its beginning,
    the reply its end."""
    room = length - sum(fixed)
    cuttable: dict[int, list[int]] = {FIRST_PROMPT: [], FIRST_REPLY: [], LATER: []}
    for t, (is_fixed, where) in enumerate(zip(fixed, part)):
        if not is_fixed:
            cuttable[where].append(t)
    prompt, reply, later = cuttable[FIRST_PROMPT], cuttable[FIRST_REPLY], cuttable[LATER]
    keep_later = max(0, min(len(later), room - len(prompt) - len(reply)))
    keep_prompt, keep_reply = share_room(len(prompt), len(reply), room - keep_later)
    kept = [t for t, is_fixed in enumerate(fixed) if is_fixed]
    kept += prompt[len(prompt) - keep_prompt :] + reply[:keep_reply] + later[:keep_later]
    return sorted(kept)
