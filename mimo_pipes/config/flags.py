"""A configuration field's flag: every error names the flag a user would type (``reorder_window_size`` is
``--reorder-window-size``)."""

from __future__ import annotations


def flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")
