"""The library's per-sample processing as it was before each of its recent changes (rows in flight following the
workers, pixels viewed, text tokenized without the GIL, micro-batch buffers used again, a step's rows read together and states copied once, pixels laid out in their micro-batch's buffer, freed blocks kept), for benchmarks that
measure the code before beside the code in the same run (``rank_throughput.py``'s ``.../ahead1/copied/held``
variants, ``data_wait.py``'s ``--windows-ahead``, ``--copied-pixels``, ``--held-encode``, ``--fresh-buffers``, ``--row-reads``; ``--copied-out``, ``--trimmed``; ``rank_throughput.py``'s ``/copiedout``, ``/trimmed``). Each patch stands for one
change, so each can be measured alone; they last for the process (each benchmark cell is one)."""

from __future__ import annotations


def restore_code_before(*, windows_ahead: int | None = None, copied_pixels: bool = False, held_encode: bool = False,
                        fresh_buffers: bool = False, row_reads: bool = False, copied_out: bool = False,
                        trimmed: bool = False) -> None:
    """``windows_ahead``: RowProcessor processes that many windows ahead whatever its workers (before: 1);
    ``copied_pixels``: each resized image's pixels copied out of PIL (``np.asarray``: ``tobytes``, holding the GIL)
    instead of viewed; ``held_encode``: text tokenized with the tokenizer's ``encode``, which holds the GIL;
    ``fresh_buffers``: every micro-batch's pixel buffer made fresh (``torch.empty``) and unmapped by whichever
    thread drops the micro-batch, instead of taken from and given back to RowProcessor's pool; ``row_reads``: the
    reader reads one row at a time (no ``__getitems__``), and every node's state deep-copies its description and its
    source's state (each already a copy) for every row read ahead; ``copied_out``: each row's pixels laid out in an
    array of their own and copied into the micro-batch's buffer afterwards, instead of laid out there; ``trimmed``: the
    C allocator left at glibc's defaults (freed blocks unmapped or trimmed and faulted in again), instead of keeping them."""
    if trimmed:
        import os

        from mimo_pipes.data.processing import heap

        heap._done[os.getpid()] = False  # as if set already: the thresholds stay glibc's
    if copied_out:
        import contextlib

        from mimo_pipes.nodes import row_processor

        row_processor.pixels_into = lambda target: contextlib.nullcontext()
    if windows_ahead is not None:
        from mimo_pipes.nodes import row_processor

        row_processor.windows_ahead = lambda workers, rows_per_window: windows_ahead
    if copied_pixels:
        import numpy as np

        from mimo_pipes.data.processing import fast_pixels

        fast_pixels.rgb_pixels = np.asarray
    if held_encode:
        from mimo_pipes.data.processing.processor import SampleProcessor

        SampleProcessor._encode = lambda self, text: self._tokenizer.encode(text, add_special_tokens=False).ids
    if fresh_buffers:
        import torch

        from mimo_pipes.samples.buffer_pool import BufferPool

        BufferPool.take = lambda self, numel, dtype: torch.empty(numel, dtype=dtype)
    if row_reads:
        import copy

        from mimo_pipes.nodes import base
        from mimo_pipes.nodes.canonical_shard_reader import CanonicalShardReader

        CanonicalShardReader._step_rows = lambda self, step: None

        def get_state(self):  # the get_state of before: a deep copy of everything, at every level
            state = {}
            if self.valid_for is not None:
                state[self.VALID_FOR_KEY] = copy.deepcopy(self.valid_for)
            if self.source is not None:
                state[self.SOURCE_KEY] = copy.deepcopy(self.source_state())
            state.update(copy.deepcopy(self.own_state()))
            return state

        base.GraphNode.get_state = get_state
