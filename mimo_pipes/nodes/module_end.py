"""ModuleEnd: the end of a module's exchanged stream, carrying the agreement its ranks still owe each other."""

from __future__ import annotations

from collections.abc import Callable


class ModuleEnd(StopIteration):
    """The end of the windows a module's balance exchange hands on, agreed by the module's ranks, with one
    agreement still owed: :meth:`agree`, called once by the node that processes the windows' rows
    (:class:`~mimo_pipes.nodes.RowProcessor`) when every window it read has been processed, says whether
    that processing failed and raises on every rank if it failed on any. The rows of the last windows are
    processed after every exchange is done, so this is how a failure among them reaches the module's other
    ranks (earlier failures travel with the next exchange). It travels down with the data, as the end does:
    no node calls the node it reads from."""

    def __init__(self, agree: Callable[[BaseException | None], None]) -> None:
        super().__init__()
        self._agree = agree

    def agree(self, error: BaseException | None) -> None:
        """Every rank of the module calls it once: None when this rank's windows were processed; else the failure,
        raised here (and as a PeerError naming this rank on the others)."""
        self._agree(error)
