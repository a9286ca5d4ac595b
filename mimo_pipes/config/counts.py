"""Counts where they enter: consumed micro-batches and samples, batch sizes, window sizes, workers.

:func:`as_count` is the one check (numpy and torch integers taken as ints; bools, floats, strings and values
below the range refused in one line naming the setting). It lives in :mod:`mimo_pipes.errors`, the floor every
part of the library stands on (the layout, the samples and the time model check counts too); import it from
either.
"""

from mimo_pipes.errors import as_count

__all__ = ["as_count"]
