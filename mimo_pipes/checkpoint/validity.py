"""What a saved state is valid for, and the one check that refuses a state made for other settings.

Each node of the graph builds, once in ``__init__``, a ``valid_for`` description: its class and every
setting that shapes its stream (B/d, W, DP layout, seed, the source's length and fingerprint, cost
function, collation). ``get_state`` stores it under :data:`VALID_FOR_KEY`; ``reset(initial_state)``
refuses a state whose description differs, naming the setting and both values, before anything is read.

States saved before these checks carry no description and are refused as well: nothing tells what they
were made for. Such a run resumes from its consumed micro-batch count instead (``consumed_microbatches``).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from mimo_pipes.errors import StateMismatchError

VALID_FOR_KEY = "valid_for"
NODE = "node"  # the description's entry that names the node's class
SAMPLED_ROWS = 3  # rows hashed for the fingerprint of a source that has none of its own
MISSING = object()  # a setting one side does not record (saved by another version)
# Where a rank sits in its module: a state saved with other values was saved under another layout, which a
# graph restores by starting at the saved global position (GraphLoader) when nothing else differs.
LAYOUT_SETTINGS = ("dp rank", "dp size", "canonical grid size")
# B/d: follows from the global micro-batch size and the layout.
PER_RANK_SETTINGS = ("micro-batch size per rank", "rows per batch")
ON_ANOTHER_LAYOUT = (
    ": the state was saved under another layout, which it can continue only while everything that shapes "
    "the global stream is unchanged"
)


def valid_for(node: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """A node's description: ``node`` plus readable setting names, values made JSON-plain (tuples become
    lists), so a description compares equal to itself after a round trip through a JSON checkpoint."""
    return json.loads(json.dumps({NODE: node, **settings}, default=_plain))


def plain_copy(value: Any) -> Any:
    """A copy of a JSON-plain value (what :func:`valid_for` makes): its dicts and lists new, the rest shared
    (strings, numbers, booleans and None do not change). Several times faster than ``copy.deepcopy``, which a
    state pays for every item read ahead."""
    if isinstance(value, dict):
        return {key: plain_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_copy(item) for item in value]
    return value


def collation_settings(collator: Any) -> dict[str, Any]:
    """A collator's settings (every field of the dataclass), named for :func:`valid_for`."""
    return {f"collation {field.name.replace('_', ' ')}": getattr(collator, field.name) for field in dataclasses.fields(collator)}


def check_valid_for(saved_state: Any, expected: Mapping[str, Any], reason: str = "") -> None:
    """Raise :class:`StateMismatchError` unless ``saved_state`` was made for the node ``expected`` describes
    (``reason``, if given, is added to the message of a differing setting)."""
    node = str(expected[NODE])
    saved = saved_state.get(VALID_FOR_KEY) if isinstance(saved_state, Mapping) else None
    if not isinstance(saved, Mapping):
        raise StateMismatchError(
            node, VALID_FOR_KEY,
            "the saved state does not say what it is valid for (saved before mimo-pipes checked states, or not "
            "by this graph), so it is refused; resume from the consumed micro-batch count instead",
        )
    if saved.get(NODE) != node:
        raise StateMismatchError(node, NODE, f"the saved state is a {saved.get(NODE)}'s state, not a {node}'s: it was made with another graph")
    for setting in [*expected, *(name for name in saved if name not in expected)]:
        before, now = saved.get(setting, MISSING), expected.get(setting, MISSING)
        if before != now:
            raise StateMismatchError(node, setting, f"saved state was made with {setting} {show_setting(before)}, this graph has {show_setting(now)}{reason}")


def on_other_layout(saved_state: Any, expected: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``saved_state`` (a graph's) was saved by a rank of another layout than ``expected``'s nodes
    describe: a node of the same class records another DP rank, DP size or canonical grid."""
    for saved, description in zip(nested_node_states(saved_state), expected):
        found = saved.get(VALID_FOR_KEY)
        if isinstance(found, Mapping) and found.get(NODE) == description.get(NODE):
            if any(key in description and found.get(key, MISSING) != description[key] for key in LAYOUT_SETTINGS):
                return True
    return False


def on_saved_layout(description: Mapping[str, Any], saved: Mapping[str, Any]) -> dict[str, Any]:
    """A node's description as it would read on the layout a saved description records: the settings of
    :data:`LAYOUT_SETTINGS` and :data:`PER_RANK_SETTINGS` taken from ``saved``, everything else its own.
    Raises StateMismatchError when the global micro-batch size (B/d times d) differs."""
    node, dp = str(description.get(NODE)), "dp size"
    for per_rank in PER_RANK_SETTINGS:
        if all(isinstance(d.get(key), int) for d in (description, saved) for key in (per_rank, dp)):
            before, now = saved[per_rank] * saved[dp], description[per_rank] * description[dp]
            if before != now:
                message = f"saved state was made with micro-batch size {before}, this graph has {now}{ON_ANOTHER_LAYOUT}"
                raise StateMismatchError(node, "micro-batch size", message)
    adjusted = dict(description)
    for key in (*LAYOUT_SETTINGS, *PER_RANK_SETTINGS):
        if key in description and key in saved:
            adjusted[key] = saved[key]
    return adjusted


def check_graph_state(saved_state: Any, expected: Sequence[Mapping[str, Any]], reason: str = "") -> None:
    """Check a whole graph's state at once: ``expected`` lists the nodes' descriptions from the root down,
    as the nodes' states nest (other nodes, e.g. torchdata's mappers, may sit between them). Described
    states nested deeper than the last expected node belong to nodes the walk cannot reach (a loader used
    as a source, say): they are left to those nodes, which check them when they are restored."""
    saved = nested_node_states(saved_state)
    for index, description in enumerate(expected):
        if index < len(saved):
            check_valid_for(saved[index], description, reason)
        elif not saved:
            check_valid_for(saved_state, description)  # says that the state carries no description
        else:
            raise StateMismatchError(str(description[NODE]), "graph", "the saved state holds no state for this node: it was made with another graph")


def nested_node_states(state: Any) -> list[Mapping[str, Any]]:
    """The states that carry a description, outermost first: each one's nearest described descendant."""
    found: list[Mapping[str, Any]] = []
    current = _nearest_described([state])
    while current is not None:
        found.append(current)
        current = _nearest_described(value for key, value in current.items() if key != VALID_FOR_KEY)
    return found


def _nearest_described(values: Iterable[Any]) -> Mapping[str, Any] | None:
    queue = collections.deque(values)
    while queue:
        value = queue.popleft()
        if isinstance(value, Mapping):
            if VALID_FOR_KEY in value:
                return value
            queue.extend(value.values())
        elif isinstance(value, (list, tuple)):
            queue.extend(value)
    return None


def source_fingerprint(dataset: Any, rows: Sequence[int]) -> str:
    """A cheap fingerprint of a map-style source, never reading all of it: a Hugging Face dataset's own
    ``_fingerprint`` when it has one (nothing is read), else a hash of the contents of the first
    :data:`SAMPLED_ROWS` of ``rows`` (a reader passes rows of its own shard, so scalable DP still reads
    only this rank's slots)."""
    own = getattr(dataset, "_fingerprint", None)
    if isinstance(own, str) and own:
        return f"datasets:{own}"
    digest = hashlib.sha256()
    for index in list(rows)[:SAMPLED_ROWS]:
        digest.update(f"row {int(index)}:".encode())
        _feed(digest, dataset[int(index)])
    return f"rows:{digest.hexdigest()[:16]}"


def _feed(digest: Any, value: Any) -> None:
    """Add ``value`` to ``digest`` the same way in every process (no ids, no hash randomisation)."""
    if isinstance(value, Mapping):
        for key in sorted(value, key=str):
            digest.update(f"<{key}>".encode())
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"[{len(value)}".encode())
        for item in value:
            _feed(digest, item)
    elif _is_tensor(value):
        torch = sys.modules["torch"]
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(value, np.ndarray):
        digest.update(f"{value.dtype}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    elif value is None or isinstance(value, (str, bytes, int, float, bool)):
        digest.update(repr(value).encode())
    elif callable(getattr(value, "tobytes", None)):  # e.g. a PIL image
        digest.update(type(value).__name__.encode())
        digest.update(value.tobytes())
    else:
        digest.update(type(value).__name__.encode())


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    if type(value).__name__ == "dtype":  # torch or numpy dtypes of declared vision fields: by name
        return str(value)
    raise TypeError(f"a state's description holds plain values only, got {type(value).__name__}")


def show_setting(value: Any, *, missing: str = "(not recorded)", none: str = "none") -> str:
    """A setting's value as a mismatch message shows it: strings as they are, the rest as JSON; ``MISSING`` (a
    setting one side does not know) and ``None`` in words."""
    if value is MISSING:
        return missing
    if value is None:
        return none
    return value if isinstance(value, str) else json.dumps(value)


def _is_tensor(value: Any) -> bool:
    """A torch tensor, without importing torch where nothing has (no tensor can exist then)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)
