"""The contract every node keeps, held to the code: every library node is a GraphNode; the graph names its
links (no probing by name, no weak references, no scan of an object's attributes); no node calls back the
node it reads from; the restart position has one name, in the loader alone, and states saved under the
older name still load (also on another layout)."""

from __future__ import annotations

import ast
import dataclasses
import json
import weakref
from pathlib import Path

import pytest
import torch
from node_checks import take
from source_trees import parsed
from test_elastic_loader import GRID_1, GRID_2, graph, ids
from test_node_balance_exchange import COLLATOR, windows
from torchdata.nodes import BaseNode

import mimo_pipes
import mimo_pipes.nodes
from mimo_pipes.errors import StateMismatchError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.graph.loader import GraphLoader
from mimo_pipes.nodes import BalanceExchange
from mimo_pipes.nodes.base import GraphNode
from mimo_pipes.testing import tail_settings

PACKAGE = Path(mimo_pipes.__file__).parent
RECIPES = PACKAGE.parent / "recipes"
# Other names the restart position went by; none may appear as a key of a saved graph state.
RETIRED_NAMES = {"num_yielded", "consumed", "first_step", "skip_first", "position", "start"}
# What a node may ask of the node it reads from: its next item, a reset, its state.
SOURCE_CALLS = {"reset", "state_dict"}


def _trees(*roots: Path) -> list[tuple[Path, ast.Module]]:
    return [(path, parsed(path)) for root in roots for path in sorted(root.rglob("*.py"))]


def _base_names(node: ast.ClassDef) -> list[str]:
    names = []
    for base in node.bases:
        target = base.value if isinstance(base, ast.Subscript) else base
        names.append(target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", ""))
    return names


def test_no_library_class_but_graph_node_derives_base_node() -> None:
    direct = [f"{path.relative_to(PACKAGE.parent)}:{node.name}" for path, tree in _trees(PACKAGE, RECIPES)
              for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and "BaseNode" in _base_names(node)]
    assert direct == ["mimo_pipes/nodes/base.py:GraphNode"]


def test_every_node_the_package_exports_is_a_graph_node() -> None:
    exported = [getattr(mimo_pipes.nodes, name) for name in mimo_pipes.nodes.__all__]
    assert exported and all(issubclass(node, GraphNode) for node in exported)


def test_the_graph_and_its_nodes_name_their_links() -> None:
    """No getattr / hasattr probes, no weakref, no scan of ``__dict__`` in graph/ and nodes/."""
    offenders = []
    for path, tree in _trees(PACKAGE / "graph", PACKAGE / "nodes"):
        for node in ast.walk(tree):
            where = f"{path.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
                offenders.append(f"{where} {node.func.id}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and any("weakref" in (alias.name or "") for alias in node.names):
                offenders.append(f"{where} weakref")
            elif isinstance(node, ast.ImportFrom) and node.module == "weakref":
                offenders.append(f"{where} weakref")
            elif isinstance(node, ast.Attribute) and node.attr in ("__dict__", "finalize"):
                offenders.append(f"{where} {node.attr}")
    assert offenders == []


def test_no_node_calls_back_the_node_it_reads_from() -> None:
    """A node reads its source (``next``), resets it and saves its state; nothing else: what it must tell the
    nodes before it travels with the data or through the loader."""
    offenders = []
    for path, tree in _trees(PACKAGE / "nodes"):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and owner.attr == "source" and node.func.attr not in SOURCE_CALLS:
                offenders.append(f"{path.name}:{node.lineno} source.{node.func.attr}")
    assert offenders == []


def _reaches_a_node(value: object, seen: set[int]) -> bool:
    """Whether ``value`` holds a node, directly or through what it holds (weak references followed)."""
    if id(value) in seen or value is None or isinstance(value, (str, bytes, int, float, torch.Tensor)):
        return False
    seen.add(id(value))
    if isinstance(value, BaseNode):
        return True
    if isinstance(value, weakref.ref):
        held = [value()]
    elif isinstance(value, dict):
        held = list(value.values())
    elif isinstance(value, (list, tuple, set)):
        held = list(value)
    elif dataclasses.is_dataclass(value):
        held = [getattr(value, field.name) for field in dataclasses.fields(value)]
    else:
        held = list(vars(value).values()) if hasattr(value, "__dict__") else []
        held += [getattr(value, "__self__", None)]  # a bound method holds its object
    return any(_reaches_a_node(item, seen) for item in held)


@pytest.mark.parametrize("report_on_delivery", [True, False])
def test_a_window_handed_on_holds_no_node(report_on_delivery) -> None:
    """What the exchange hands on is data (its record at most): nothing in it leads back to a node."""
    settings = tail_settings(samples_per_rank=4, window_size=3, reorder=True, collator=COLLATOR)
    node = BalanceExchange(windows(), settings=settings, layout=RankLayout(0, 1, 2), report_on_delivery=report_on_delivery)
    delivered = take(node, None)
    assert len(delivered) == 3
    assert not any(_reaches_a_node(window, set()) for window in delivered)
    assert all((window.record is not None) != report_on_delivery for window in delivered)


def _keys(state: object) -> set[str]:
    if isinstance(state, dict):
        return {str(key) for key in state} | {key for value in state.values() for key in _keys(value)}
    if isinstance(state, list):
        return {key for value in state for key in _keys(value)}
    return set()


def test_the_restart_position_has_one_name_in_the_saved_state() -> None:
    loader = graph(GRID_2)
    take(loader, 5)
    state = loader.state_dict()
    loader.close()
    assert state[GraphLoader.CONSUMED_KEY] == 5
    assert _keys(state) & RETIRED_NAMES == set()


def _older(state: dict) -> dict:
    """``state`` as a loader saved it before the one name: the count under ``num_yielded``."""
    older = dict(state)
    older[GraphLoader.OLDER_CONSUMED_KEY] = older.pop(GraphLoader.CONSUMED_KEY)
    return older


@pytest.mark.parametrize("target", [GRID_1, GRID_2], ids=["same-layout", "another-layout"])
def test_a_state_saved_under_the_older_name_still_loads(target) -> None:
    saver = graph(GRID_1)
    take(saver, 6)
    state = json.loads(json.dumps(_older(saver.state_dict())))
    rest = ids(take(saver, 6))
    saver.close()
    loader = graph(target)
    loader.load_state_dict(state)
    assert loader.consumed_microbatches == 6
    got = ids(take(loader, 6))
    assert sorted(sum(got, [])) == sorted(sum(rest, []))
    if target is GRID_1:
        assert got == rest
    assert loader.state_dict()[GraphLoader.CONSUMED_KEY] == 12
    loader.close()


def test_a_state_without_a_count_is_refused_naming_the_field() -> None:
    saver = graph(GRID_1)
    state = saver.state_dict()
    saver.close()
    del state[GraphLoader.CONSUMED_KEY]
    with pytest.raises(StateMismatchError, match="^GraphLoader: the saved state.s consumed_microbatches is missing"):
        graph(GRID_1).load_state_dict(state)


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_the_loader_refuses_a_count_that_is_not_one(bad) -> None:
    with pytest.raises(ValueError, match="^consumed_microbatches: must be an integer >= 0"):  # a ConfigError is a ValueError
        GraphLoader(graph(GRID_1).root, consumed_microbatches=bad)


class _Counting(GraphNode[int]):
    """A reader of 0, 1, 2, ... that notes what the loader tells it."""

    def __init__(self, end: int) -> None:
        super().__init__()
        self.end, self.aborted, self.starts = end, [], []

    def start_at(self, point, saved_state=None) -> None:
        self.starts.append(point.consumed_microbatches)

    def restore(self, initial_state: dict | None) -> None:
        self.next_item = 0 if initial_state is None else initial_state["next"]

    def next(self) -> int:
        if self.next_item == self.end:
            raise StopIteration
        self.next_item += 1
        return self.next_item - 1

    def own_state(self) -> dict:
        return {"next": self.next_item}

    def abort(self, error: BaseException) -> None:
        self.aborted.append(error)


class _FailingAt(GraphNode[int]):
    def __init__(self, source: BaseNode, item: int) -> None:
        super().__init__(source)
        self.item = item

    def next(self) -> int:
        value = next(self.source)
        if value == self.item:
            raise ValueError(f"item {value}")
        return value


def test_a_failure_after_a_node_reaches_it_through_the_loader() -> None:
    reader = _Counting(10)
    loader = GraphLoader(_FailingAt(reader, 3), consumed_microbatches=2)
    assert [next(loader), next(loader), next(loader)] == [0, 1, 2]
    assert reader.starts == [2]  # told where the run starts, before its reset
    with pytest.raises(ValueError, match="item 3"):
        next(loader)
    assert [str(error) for error in reader.aborted] == ["item 3"]
    ended = _Counting(2)
    assert list(GraphLoader(ended)) == [0, 1] and ended.aborted == []  # the end of a stream is no failure
