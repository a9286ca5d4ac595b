"""The suite's own split into shards (``--shard K/N``, see conftest.py): every module once, whole,
the same everywhere, and loads within one module of each other."""

from __future__ import annotations

from conftest import shard_modules
from hypothesis import given
from hypothesis import strategies as st

modules_and_seconds = st.dictionaries(st.from_regex(r"tests/test_[a-z]{1,8}\.py", fullmatch=True),
                                      st.floats(0.0, 500.0, allow_nan=False), min_size=0, max_size=40)


@given(modules_and_seconds, st.integers(1, 5), st.data())
def test_every_module_lands_in_exactly_one_shard_and_loads_stay_close(seconds, shards, data):
    unknown = data.draw(st.lists(st.from_regex(r"tests/test_new[a-z]{1,4}\.py", fullmatch=True), max_size=5, unique=True))
    modules = sorted(set(seconds) | set(unknown))
    dealt = shard_modules(modules, shards, seconds)
    assert len(dealt) == shards
    assert sorted(m for shard in dealt for m in shard) == modules
    assert dealt == shard_modules(list(reversed(modules)), shards, dict(reversed(list(seconds.items()))))
    loads = [sum(seconds.get(m, 2.0) for m in shard) for shard in dealt]
    heaviest_module = max((seconds.get(m, 2.0) for m in modules), default=0.0)
    assert max(loads) - min(loads) <= heaviest_module + 1e-9
