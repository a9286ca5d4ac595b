"""The library's source files, parsed once a test run: the architecture, node-contract and one-home checks read
the same trees (each parse of the package's 230-odd files took about 0.6 CPU-s)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The tree of the Python file ``path``, shared: callers only read it."""
    return ast.parse(path.read_text(), filename=str(path))
