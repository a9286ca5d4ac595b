"""Checks every node test shares: save and restore at every position, exact comparison of items, and the
refusal of a state made for other settings."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from torchdata.nodes import BaseNode

from mimo_pipes.errors import StateMismatchError
from mimo_pipes.nodes import CanonicalShardReader
from mimo_pipes.samples.sample import SAMPLE_ID, STEP
from mimo_pipes.testing import SyntheticProcessedDataset


class CountingSource(BaseNode[dict]):
    """Yields samples of steps 0, 1, ...; two samples per step. Its get_state hands out a LIVE dict
    (as some nodes do), so a caller that keeps it without copying sees it change."""

    NEXT_KEY = "next"

    def __init__(self, total: int = 40) -> None:
        super().__init__()
        self.total = total

    def reset(self, initial_state=None):
        super().reset(initial_state)
        self._state = {self.NEXT_KEY: 0 if initial_state is None else initial_state[self.NEXT_KEY]}

    def next(self):
        index = self._state[self.NEXT_KEY]
        if index >= self.total:
            raise StopIteration
        self._state[self.NEXT_KEY] = index + 1
        return {SAMPLE_ID: index, STEP: index // 2, "input_ids": torch.tensor([index, index + 1])}

    def get_state(self):
        return self._state  # live on purpose


def starting_at(node, first_step: int = 0, skip_first: int = 0, composition=None):
    """``node`` told, as a loader tells it before its first reset, that the graph starts at ``first_step``
    (skipping ``skip_first`` micro-batches of that window)."""
    from mimo_pipes.checkpoint.resume import ResumePoint

    node.start_at(ResumePoint(first_step + skip_first, first_step, skip_first, composition))
    return node


def tiny_samples(per_microbatch: int, steps: int, first_step: int = 0) -> CanonicalShardReader:
    """``steps`` micro-batches of ``per_microbatch`` tiny samples (DP 1), read from ``first_step`` on."""
    dataset = SyntheticProcessedDataset(per_microbatch * steps, text_tokens=2, patch_dim=1)
    return starting_at(CanonicalShardReader(dataset, micro_batch_size=per_microbatch, dp_rank=0, dp_size=1, grid_size=1,
                                            dataloader_type="single"), first_step)


def assert_same(got: Any, want: Any, where: str = "item") -> None:
    """Equal structure and values; tensors equal in dtype, shape and every element."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: {type(got).__name__} instead of a tensor"
        assert got.dtype == want.dtype and got.shape == want.shape, f"{where}: {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"
        assert torch.equal(got, want), f"{where}: tensor values differ"
    elif dataclasses.is_dataclass(want) and not isinstance(want, type):
        assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
        for field in dataclasses.fields(want):
            if field.compare:  # a field declared not to be data (a window's receipt) is not compared
                assert_same(getattr(got, field.name), getattr(want, field.name), f"{where}.{field.name}")
    elif isinstance(want, Mapping):
        assert isinstance(got, Mapping) and set(got) == set(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for index, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"{where}[{index}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def take(node: BaseNode, count: int | None) -> list[Any]:
    """``count`` items (all of them when None); fewer if the node ends first."""
    items = []
    while count is None or len(items) < count:
        try:
            items.append(next(node))
        except StopIteration:
            break
    return items


def as_saved(state: dict[str, Any]) -> dict[str, Any]:
    """A state as a checkpoint holds it: through JSON, so nothing in it may be live or non-plain."""
    return json.loads(json.dumps(state))


def reset_node(node: BaseNode, state: dict[str, Any]) -> None:
    node.reset(state)


def load_into_loader(loader: Any, state: dict[str, Any]) -> None:
    loader.load_state_dict(state)
    iter(loader)


def check_save_load_everywhere(
    make_node: Callable[[], Any], count: int | None = None, restore: Callable[[Any, dict[str, Any]], None] = reset_node
) -> list[Any]:
    """The torchdata-style restore check, at EVERY position.

    Runs a fresh node to its end (or ``count`` items) for the reference stream. A second run takes
    ``state_dict()`` before each item (so positions 0..n, the end included) and must still give the
    reference stream. Then, for every position k, a fresh node restored from the state after k items
    gives exactly reference[k:], and reports the state it was restored from. Returns the reference.
    ``restore`` puts a state into a fresh node (``reset``; :func:`load_into_loader` for a loader).
    """
    reference = take(make_node(), count)
    assert reference, "the node yielded nothing: the check would prove nothing"
    node, states, stream = make_node(), [], []
    for _ in range(len(reference)):
        states.append(as_saved(node.state_dict()))
        stream.extend(take(node, 1))
    states.append(as_saved(node.state_dict()))
    assert_same(stream, reference, "stream with state_dict() calls")
    for position, state in enumerate(states):
        restored = make_node()
        restore(restored, copy.deepcopy(state))
        assert as_saved(restored.state_dict()) == state, f"restored after {position}: reports another state"
        rest = take(restored, len(reference) - position)
        assert_same(rest, reference[position:], f"restored after {position} of {len(reference)}")
        if count is None:
            assert take(restored, 1) == [], f"restored after {position}: yields past the end"
    return reference


def saved_after(node: BaseNode, items: int) -> dict[str, Any]:
    take(node, items)
    return as_saved(node.state_dict())


def check_refused(restore: Callable[[dict[str, Any]], Any], state: dict[str, Any], node: str, setting: str, saved: Any, now: Any) -> None:
    """``restore(state)`` raises the one-line StateMismatchError naming the node, setting and both values."""
    with pytest.raises(StateMismatchError) as raised:
        restore(copy.deepcopy(state))
    show = ["none" if value is None else value if isinstance(value, str) else json.dumps(value) for value in (saved, now)]
    expected = f"{node}: saved state was made with {setting} {show[0]}, this graph has {show[1]}"
    assert str(raised.value) == expected
    assert raised.value.setting == setting and "\n" not in str(raised.value)
