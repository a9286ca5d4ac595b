"""The graph's nodes, one per file, each a :class:`~mimo_pipes.nodes.base.GraphNode` (the contract every node
keeps): reader, costs, windows, exchange, processing after it, collation, assembly, sequence packing,
uncollation."""

from mimo_pipes.nodes.balance_exchange import BalanceExchange
from mimo_pipes.nodes.canonical_shard_reader import CanonicalShardReader
from mimo_pipes.nodes.cost_annotator import CostAnnotator
from mimo_pipes.nodes.microbatch_assembler import MicroBatchAssembler
from mimo_pipes.nodes.row_processor import RowProcessor
from mimo_pipes.nodes.sequence_packer import SequencePacker
from mimo_pipes.nodes.snapshot_guard import SnapshotGuard
from mimo_pipes.nodes.uncollate import Uncollate
from mimo_pipes.nodes.window_collator import WindowCollator
from mimo_pipes.nodes.windower import Windower

__all__ = [
    "BalanceExchange",
    "CanonicalShardReader",
    "CostAnnotator",
    "MicroBatchAssembler",
    "RowProcessor",
    "SequencePacker",
    "SnapshotGuard",
    "Uncollate",
    "WindowCollator",
    "Windower",
]
