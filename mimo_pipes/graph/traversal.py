"""Walking a graph: its nodes from the root down, what each is valid for, and where a graph restarts from.

A node's sources are named, never searched for: a :class:`~mimo_pipes.nodes.base.GraphNode` says them
(``sources()``); torchdata's own nodes are known by type (:func:`node_sources`). A node of another library is
a leaf: what it reads is its own."""

from __future__ import annotations

import copy
from typing import Any

from torchdata.nodes import (
    BaseNode,
    Batcher,
    IterableWrapper,
    MultiNodeWeightedSampler,
    ParallelMapper,
    PinMemory,
    Prefetcher,
    SamplerWrapper,
    Unbatcher,
)
from torchdata.nodes.map import _ParallelMapperImpl

from mimo_pipes.checkpoint.validity import nested_node_states
from mimo_pipes.errors import StateMismatchError
from mimo_pipes.nodes.base import GraphNode, Restartable
from mimo_pipes.nodes.microbatch_assembler import MicroBatchAssembler
from mimo_pipes.nodes.windower import Windower

# torchdata's nodes that read one ``source`` (ParallelMapper reads through its inner node, below).
_ONE_SOURCE = (_ParallelMapperImpl, Batcher, Unbatcher, Prefetcher, PinMemory)


def node_sources(node: BaseNode) -> tuple[BaseNode, ...]:
    """The nodes ``node`` reads from: a GraphNode's ``sources()``, torchdata's nodes by type, else none."""
    if isinstance(node, GraphNode):
        return node.sources()
    if isinstance(node, ParallelMapper):
        return (node._it,)  # its inner node (which runs the threads) reads its source
    if isinstance(node, _ONE_SOURCE):
        return (node.source,)
    if isinstance(node, MultiNodeWeightedSampler):
        return tuple(node.source_nodes.values())
    return ()


def graph_nodes(root: BaseNode) -> list[BaseNode]:
    """Every node reachable from ``root``, each once, consumers before their sources."""
    order: list[BaseNode] = []
    seen = {id(root)}
    stack = [(root, iter(node_sources(root)))]
    while stack:  # depth first; the reversed post-order puts every node before the nodes it reads
        node, links = stack[-1]
        child = next(links, None)
        if child is None:
            stack.pop()
            order.append(node)
        elif id(child) not in seen:
            seen.add(id(child))
            stack.append((child, iter(node_sources(child))))
    order.reverse()
    return order


def described_nodes(root: BaseNode) -> list[GraphNode]:
    """The graph's nodes whose state says what it is valid for, from the root down."""
    return [node for node in graph_nodes(root) if isinstance(node, GraphNode) and node.valid_for is not None]


def on_layout(node: GraphNode, saved: Any) -> dict[str, Any]:
    """``node``'s description on the layout ``saved`` (a saved description) records."""
    assert node.valid_for is not None
    if not isinstance(saved, dict) or saved.get("node") != node.valid_for.get("node"):
        return node.valid_for  # another graph: the plain check names it
    return node.valid_for_layout(saved)


def window_size(nodes: list[BaseNode]) -> int:
    return next((node.window_size for node in nodes if isinstance(node, Windower)), 1)


def saved_composition(root: BaseNode, root_state: Any) -> list[list[int]] | None:
    """The composition a saved state holds for the window it stands in (MicroBatchAssembler keeps it)."""
    for node, state in zip(described_nodes(root), nested_node_states(root_state)):
        if isinstance(node, MicroBatchAssembler):
            return copy.deepcopy(state.get(MicroBatchAssembler.COMPOSITION_KEY))
    return None


def wrapped(node: BaseNode) -> list[Any]:
    """What a torchdata wrapper reads from (IterableWrapper's iterable, SamplerWrapper's sampler)."""
    if isinstance(node, IterableWrapper):
        return [node.iterable]
    if isinstance(node, SamplerWrapper):
        return [node.sampler]
    return []


def check_restartable(root: BaseNode) -> None:
    """Every source of the graph can start at a given global micro-batch, or StateMismatchError: a GraphNode
    reader starts where the loader tells it, and so does a wrapped sampler or iterable with ``start_at``."""
    for node in graph_nodes(root):
        if node_sources(node) or isinstance(node, GraphNode):
            continue
        if not any(isinstance(target, Restartable) for target in (node, *wrapped(node))):
            name = type(next(iter(wrapped(node)), node)).__name__
            raise StateMismatchError(
                name, "dp size",
                f"the state was saved under another layout, and this graph's source {name} cannot start at a given "
                "global micro-batch (it has no start_at): restore a state saved under this layout, or resume from the "
                "consumed micro-batch count",
            )
