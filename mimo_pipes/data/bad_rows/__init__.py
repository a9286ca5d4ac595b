"""The kinds of bad dataset row: what :attr:`mimo_pipes.errors.SampleError.kind` names, and what
``mimo-pipes check`` counts its bad rows by. Each is a short phrase a report can print as it stands."""

from __future__ import annotations

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
