"""Argument types shared by the commands."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mimo_pipes.cli.commands.argtypes import positive_ints


@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=8))
def test_comma_separated_positive_integers_round_trip(values):
    assert positive_ints(",".join(map(str, values))) == tuple(values)


@pytest.mark.parametrize("text", ["", "0", "2,-1", "a,2", "1.5"])
def test_anything_else_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        positive_ints(text)
