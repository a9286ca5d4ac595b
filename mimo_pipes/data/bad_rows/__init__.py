"""The kinds of bad dataset row: what :attr:`mimo_pipes.errors.SampleError.kind` names, and what
``mimo-pipes check`` counts its bad rows by. Each is a short phrase a report can print as it stands."""

from __future__ import annotations

import functools
from collections.abc import Callable

from mimo_pipes.errors import SampleError

# Images and videos.
NO_IMAGE_FOLDER = "image path without an image folder"
OUTSIDE_IMAGE_FOLDER = "image outside the image folder"
MISSING_IMAGE = "missing image"
UNREADABLE_IMAGE = "unreadable image"
MALFORMED_VIDEO = "malformed video"
REFUSED_MEDIA = "image or video the processor refuses"
# The conversation.
MALFORMED_CONVERSATION = "malformed conversation"
NO_CONVERSATION = "no conversation"
NO_REPLY = "no reply"
IMAGE_COUNT = "image count differs from the chat's markers"
# Fitting it to --seq-length.
IMAGES_TOO_LONG = "images longer than --seq-length"
NO_TRAINED_TOKEN = "no token to train on"
# Reading the file (mimo-pipes check reads JSON files line by line when datasets cannot).
INVALID_JSON = "invalid JSON"
NOT_A_ROW = "not a JSON object"
EMPTY_FILE = "empty file"
# Reading an Energon dataset's shards.
MISSING_SHARD = "missing shard"
TRUNCATED_SHARD = "truncated shard"
STALE_INDEX = "index out of date"
UNFIT_SAMPLE = "sample that makes no conversation"

OTHER = "refused by the processor"
"""A SampleError that names no kind."""

ROW_FAULT = "__row_fault__"
"""Row key: a source that cannot read a row hands it on as ``{ROW_FAULT: {"kind", "reason"}}``, and
processing it raises that SampleError, so ``--skip-bad-samples`` and ``mimo-pipes check`` treat it as any
bad row (and the reader never fails on it)."""
ROW_PLACE = "__row_place__"
"""Row key: where a source says the row lives, when a dataset row number does not say it (an Energon
sample's ``<shard> key <key>``). Processing passes it on to no sample; every reason given for the row
names it (:func:`placed`)."""


def placed(error: SampleError, row: object) -> SampleError:
    """``error`` naming ``row``'s place (:data:`ROW_PLACE`) after its "dataset row N: ", when it does not
    name it already; ``error`` itself for a row without one."""
    place = row.get(ROW_PLACE) if isinstance(row, dict) else None
    text = error.reason if error.reason is not None else str(error)
    if not place or place in text:
        return error
    head = f"dataset row {error.sample_id}: "
    rest = text.removeprefix(head)
    return SampleError(error.sample_id, f"{head if text.startswith(head) else ''}{place}: {rest}", error.field, kind=error.kind)


def names_place(method: Callable) -> Callable:
    """A processing method ``method(self, row, ...)`` whose SampleError names the row's place (:func:`placed`)."""

    @functools.wraps(method)
    def processing(self: object, row: dict, *args: object, **kwargs: object) -> object:
        try:
            return method(self, row, *args, **kwargs)
        except SampleError as error:
            named = placed(error, row)
            if named is error:
                raise
            raise named.with_traceback(error.__traceback__) from None

    return processing
