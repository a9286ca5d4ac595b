"""Placeholder tokens found by comparing ids one by one (samples/cost.placeholder_mask): the same tokens as
``np.isin`` for any ids, dtype, shape and set of placeholder ids, and the counts built on it the same as
counting with ``np.isin``."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mimo_pipes.samples.cost import SMALL_ID_SET, image_token_count, placeholder_mask, placeholder_runs

IDS = st.integers(0, 40)  # a small vocabulary: placeholders occur often, in runs and side by side


@given(hnp.arrays(st.sampled_from([np.int32, np.int64]), hnp.array_shapes(min_dims=1, max_dims=2, max_side=60), elements=IDS),
       st.one_of(IDS, st.lists(IDS, min_size=1, max_size=SMALL_ID_SET + 4)))
def test_the_mask_is_isins(ids, placeholders):
    wanted = [placeholders] if isinstance(placeholders, int) else placeholders
    expected = np.isin(ids, wanted)
    mask = placeholder_mask(ids, placeholders)
    assert mask.dtype == np.bool_ and mask.shape == ids.shape
    assert np.array_equal(mask, expected)
    assert image_token_count(ids, placeholders) == int(expected.sum())
    assert image_token_count(ids.tolist(), placeholders) == int(expected.sum())


@given(st.lists(IDS, max_size=200), st.lists(IDS, min_size=1, max_size=3, unique=True))
def test_runs_from_a_given_mask_are_the_runs(ids, placeholders):
    ids = np.asarray(ids, dtype=np.int64)
    runs = placeholder_runs(ids, placeholders)
    assert placeholder_runs(ids, placeholders, placeholder_mask(ids, placeholders)) == runs
    assert sum(runs) == int(np.isin(ids, placeholders).sum())
    # a run is a maximal stretch of one placeholder id
    position = 0
    inside = np.isin(ids, placeholders)
    for length in runs:
        while not inside[position]:
            position += 1
        stretch = ids[position:position + length]
        assert (stretch == stretch[0]).all()
        after = position + length
        assert after == ids.shape[0] or ids[after] != stretch[0]
        position = after
