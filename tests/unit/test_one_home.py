"""Meaning defined once: the M-RoPE layout (its row count, its two layouts' turns) and the pipeline stage names
live in one module each, and every other module imports them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import torch
from source_trees import parsed

from mimo_pipes.megatron.settings import MimoBatchSettings
from mimo_pipes.megatron.stages import STAGES, stage_of
from mimo_pipes.samples.mrope_layout import MROPE_ROWS, to_mrope_first, to_rows_first

PACKAGE = Path(__file__).resolve().parents[2] / "mimo_pipes"


def _library() -> dict[str, str]:
    return {path.relative_to(PACKAGE).as_posix(): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def _assigned(path: str, name: str) -> bool:
    return any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
               for node in ast.walk(parsed(PACKAGE / path)))


def test_the_mrope_row_count_is_defined_once():
    assert [path for path in _library() if _assigned(path, "MROPE_ROWS")] == ["samples/mrope_layout.py"]


def test_position_ids_turn_between_layouts_in_one_module():
    # a transpose of the first two dimensions on a variable holding position ids, anywhere but the layout's home
    turn = re.compile(r"(position|value)\w*\.(transpose\(0, 1\)|permute\(1, 0, 2\)|movedim\(0, 1\))")
    assert [path for path, source in _library().items() if turn.search(source) and path != "samples/mrope_layout.py"] == []


def test_stage_names_are_written_once():
    literal = re.compile(r"[\"'](only|first|middle|last)[\"']")
    megatron = {path: source for path, source in _library().items() if path.startswith("megatron/")}
    assert [path for path, source in megatron.items() if literal.search(source)] == ["megatron/stages.py"]
    assert len(literal.findall(megatron["megatron/stages.py"])) == len(STAGES)
    assert MimoBatchSettings().stage == stage_of(0, 1) == STAGES[0]


def test_the_two_layouts_are_inverse_turns():
    rows_first = torch.arange(2 * MROPE_ROWS * 5).reshape(2, MROPE_ROWS, 5)
    megatron = to_mrope_first(rows_first)
    assert megatron.shape == (MROPE_ROWS, 2, 5) and megatron.is_contiguous()
    assert torch.equal(megatron[:, 1], rows_first[1]) and torch.equal(to_rows_first(megatron), rows_first)
