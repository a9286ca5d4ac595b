"""Walking a graph: its nodes from the root down, what each is valid for, and where a graph restarts from."""

from __future__ import annotations

import copy
from typing import Any

from torchdata.nodes import BaseNode

from mimo_pipes.checkpoint.validity import nested_node_states, on_saved_layout
from mimo_pipes.errors import StateMismatchError
from mimo_pipes.nodes.base import Restartable
from mimo_pipes.nodes.microbatch_assembler import MicroBatchAssembler
from mimo_pipes.nodes.windower import Windower


def described_nodes(root: BaseNode) -> list[BaseNode]:
    return [node for node in graph_nodes(root) if isinstance(getattr(node, "valid_for", None), dict)]


def on_layout(node: BaseNode, saved: Any) -> dict[str, Any]:
    """``node``'s description on the layout ``saved`` (a saved description) records."""
    if not isinstance(saved, dict) or saved.get("node") != node.valid_for.get("node"):
        return node.valid_for  # another graph: the plain check names it
    own = getattr(node, "valid_for_layout", None)
    return own(saved) if callable(own) else on_saved_layout(node.valid_for, saved)


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
    return [value for value in (getattr(node, "iterable", None), getattr(node, "sampler", None)) if value is not None]


def check_restartable(root: BaseNode) -> None:
    """Every source of the graph can start at a given global micro-batch (``start_at``), or StateMismatchError."""
    for node in graph_nodes(root):
        if linked_nodes(node):
            continue
        if not any(isinstance(target, Restartable) for target in (node, *wrapped(node))):
            name = type(next(iter(wrapped(node)), node)).__name__
            raise StateMismatchError(
                name, "dp size",
                f"the state was saved under another layout, and this graph's source {name} cannot start at a given "
                "global micro-batch (it has no start_at): restore a state saved under this layout, or resume from the "
                "consumed micro-batch count",
            )


def graph_nodes(root: BaseNode) -> list[BaseNode]:
    """Every node reachable from ``root``, each once, consumers before their sources.

    A node's links are its attributes that hold a node, or a list, tuple, set or dict of nodes
    (``source``, several sources, torchdata's inner nodes)."""
    order: list[BaseNode] = []
    seen = {id(root)}
    stack = [(root, iter(linked_nodes(root)))]
    while stack:  # depth first; the reversed post-order puts every node before the nodes it reads
        node, links = stack[-1]
        child = next(links, None)
        if child is None:
            stack.pop()
            order.append(node)
        elif id(child) not in seen:
            seen.add(id(child))
            stack.append((child, iter(linked_nodes(child))))
    order.reverse()
    return order


def linked_nodes(node: BaseNode) -> list[BaseNode]:
    linked = []
    for value in getattr(node, "__dict__", {}).values():
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, (list, tuple, set, frozenset)):
            linked.extend(item for item in value if isinstance(item, BaseNode))
        elif isinstance(value, BaseNode):
            linked.append(value)
    return linked
