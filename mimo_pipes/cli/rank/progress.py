"""The progress bar of a rank's loop (rank 0's, on stderr)."""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(enabled: bool, total: int, initial: int, desc: str = "micro-batches", unit: str = "mb") -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)
