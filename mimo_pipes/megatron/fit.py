"""Whether the data fits ``--seq-length`` at all, known before a model is built: a row whose image placeholders alone
leave no token to train on is refused by the sample processor at its first micro-batch, after the model and its
communicators are built. Counted from the rows' headers (``count_rows``), the check costs no processing."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def seq_length_problem(image_tokens: Sequence[int] | np.ndarray, seq_length: int) -> str | None:
    """Why ``seq_length`` cannot hold the data (None: no row is known to be too long): the rows whose image
    placeholders alone, plus one token to train on, exceed it. (Their markers and text need more still: a row this
    passes may still be refused by the processor, never the reverse.)"""
    tokens = np.asarray(image_tokens, dtype=np.int64)
    too_long = np.flatnonzero(tokens + 1 > seq_length)
    if too_long.size == 0:
        return None
    worst = int(too_long[np.argmax(tokens[too_long])])
    rows = f"{too_long.size} dataset row{'s' * (too_long.size != 1)}"
    return (f"{rows} need{'s' * (too_long.size == 1)} more than {seq_length} tokens for their image placeholders alone (row {worst}: {int(tokens[worst])} "
            f"placeholders and one token to train on); give a --seq-length above {int(tokens[worst]) + 1}")
