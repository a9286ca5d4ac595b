"""The job-wide agreement on rows that failed after the exchange (``rows`` payload, ``--skip-bad-samples``).

Under the ``rows`` payload a row is processed where it is trained, so only the encoder rank that decodes an
image learns that its pixels are corrupt; the other modules' ranks that hold the same sample do not. Once per
window every rank of every module says which of its rows failed (and whether it must stop), in one small
all-gather over a group of the job's ranks reserved for it; every rank then masks the same samples (see
:mod:`mimo_pipes.samples.masking`) before it hands the window out, and counts the same failures.

Called on the processing side's collating thread, once for every window each rank reads, in window order:
every rank reads the same windows (one ahead of the ones it handed out), so the calls pair up.
"""

from __future__ import annotations

from typing import NamedTuple

import torch.distributed as dist

from mimo_pipes.errors import PeerError
from mimo_pipes.exchange.lost_peers import collective

FailedRow = tuple[int, int, str]
"""(step the row was read at, its sample id, why it failed: one line)."""


class RankFailures(NamedTuple):
    """What one rank says of one window: the rows it could not process, and a failure that is not a row's
    fault (None when there is none), which stops every rank."""

    rank: int
    first_step: int
    failed: tuple[FailedRow, ...] = ()
    fatal: str | None = None


def agree_on_failures(
    group: dist.ProcessGroup | None, first_step: int, failed: tuple[FailedRow, ...], fatal: str | None
) -> list[RankFailures]:
    """Every rank's :class:`RankFailures` for the window at ``first_step``, by rank of ``group`` (None: this
    rank alone, as rank -1 when there is no process group). Raises PeerError when the ranks are not at the same
    window (a rank restored elsewhere) or a peer is lost."""
    mine = RankFailures(dist.get_rank() if dist.is_initialized() else -1, first_step, failed, fatal)
    if group is None:
        return [mine]
    said: list[RankFailures | None] = [None] * dist.get_world_size(group)
    with collective(f"the agreement on rows that failed after the exchange (window at step {mine.first_step})"):
        dist.all_gather_object(said, mine, group=group)
    every = [RankFailures(*item) for item in said if item is not None]
    steps = {item.first_step for item in every}
    if len(steps) > 1:
        at = ", ".join(f"rank {item.rank}: step {item.first_step}" for item in every)
        raise PeerError(None, f"the job's ranks are processing different windows ({at}): every module must start "
                              "from the same micro-batch")
    return every
