"""analyze's terminal tables: the run's figures and the what-ifs with their lower bounds, one row per module,
in the unit each module was balanced on (modelled ms with a time model); analysis.json keeps exact integers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from job_runs import analyze_here
from test_analysis_plot import MODEL, _analysis, _modelled_analysis

from mimo_pipes.analysis.table import format_analysis
from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.time_model.model import save_time_model

WHAT_IFS = ["no_reorder", "per_microbatch", "across_window_2", "across_window_4", "across_window_8"]


def _rows(text: str) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each table's row per module, cut into its cells (two spaces or more apart)."""
    import re

    tables, current = [], {}
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] in ("language", "images"):
            current[cells[0]] = cells
        elif current:
            tables.append(current)
            current = {}
    if current:
        tables.append(current)
    assert len(tables) == 2, text
    return tables[0], tables[1]


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.1f}"


def test_the_tables_show_modelled_ms_for_the_encoder_and_image_tokens_for_language():
    analysis, _ = _modelled_analysis(2)
    run, what_ifs = _rows(format_analysis(analysis))
    language, images = analysis.figures["language"], analysis.figures["images"]["modelled_encoder_time"]
    assert run["language"][:3] == ["language", "2", "image tokens"]
    assert run["language"][7:9] == [f"{language['critical_path_before']:,}", f"{language['critical_path_after']:,}"]
    assert run["images"][:3] == ["images", "2", "modelled ms"]
    assert run["images"][5:9] == [f"{images['spread_before'] / 1e6:,.1f}", f"{images['spread_after'] / 1e6:,.1f}",
                                  _ms(images["critical_path_before"]), _ms(images["critical_path_after"])]
    assert run["images"][9] == f"{1 - images['critical_path_after'] / images['critical_path_before']:.1%}"
    assert what_ifs["images"][2] == _ms(images["what_if"]["no_reorder"]["critical_path"])
    for cell, name in zip(what_ifs["images"][3:], WHAT_IFS[1:]):
        assert cell == f"{_ms(images['what_if'][name]['critical_path'])} [{_ms(images['critical_path_lower_bound'][name])}]"
    for cell, name in zip(what_ifs["language"][3:], WHAT_IFS[1:]):
        assert cell == f"{language['what_if'][name]['critical_path']:,} [{language['critical_path_lower_bound'][name]:,}]"


def test_the_given_setting_is_marked_and_a_cut_window_has_no_bound():
    analysis, _ = _analysis(2, steps=12)  # window 4 across, --steps inside a window of 8
    text = format_analysis(analysis)
    header = next(line for line in text.splitlines() if line.startswith("module") and "no reorder" in line)
    assert "across 4*" in header and header.count("*") == 1
    _, what_ifs = _rows(text)
    assert what_ifs["images"][-1].endswith("[-]")  # the window of 8 is cut: no bound
    assert analysis.figures["images"]["critical_path_lower_bound"]["across_window_8"] is None


def test_modelled_bounds_hold_and_json_keeps_exact_integers():
    analysis, _ = _modelled_analysis(2)
    figures = json.loads(json.dumps(analysis.figures))
    modelled = figures["images"]["modelled_encoder_time"]
    for block in (figures["images"], modelled):
        for key in ("critical_path_before", "critical_path_after"):
            assert type(block[key]) is int
        for name in WHAT_IFS[1:]:
            path, bound = block["what_if"][name]["critical_path"], block["critical_path_lower_bound"][name]
            assert type(path) is int and type(bound) is int and bound <= path
    # Every micro-batch's heaviest forward costs at least the floor: so does the bound.
    assert modelled["critical_path_lower_bound"]["per_microbatch"] >= 16 * MODEL.floor_ns


def test_analyze_prints_the_tables_in_modelled_ms_and_writes_exact_json(tmp_path):
    model = str(save_time_model(MODEL, tmp_path / "model.json"))
    out = tmp_path / "out"
    status, stdout, stderr = analyze_here(["--scalable-dp", "--intra-microbatch-reorder", "--reorder-cost-model", model, "--embedded-samples", "64",
                                           "--micro-batch-size", "8", "--steps", "8", "--quiet", "--out", str(out)])
    assert status == 0, stderr
    figures = json.loads((out / "analysis.json").read_text())
    modelled = figures["images"]["modelled_encoder_time"]
    assert modelled["unit"] == "ns of modelled encoder time" and type(modelled["critical_path_before"]) is int
    lines = stdout.splitlines()
    assert lines[0].startswith("mimo-pipes analyze: language dp=2 + images dp=2") and "time model" in lines[0]
    run, what_ifs = _rows(stdout)
    assert run["images"][2:3] + run["images"][7:9] == ["modelled ms", _ms(modelled["critical_path_before"]), _ms(modelled["critical_path_after"])]
    assert run["language"][7] == f"{figures['language']['critical_path_before']:,}"
    assert str(modelled["critical_path_before"]) not in stdout and str(modelled["critical_path_after"]) not in stdout  # no raw ns


def test_analyze_says_truncated_rows_once_with_their_count(tmp_path):
    """Rows of a fresh JSON-lines file (so its counts come from the processor, not the cache)."""
    words = np.random.default_rng(0).integers(2, 40, 48)
    rows = [{"messages": [{"role": "user", "content": "Say it. " + " ".join(["word"] * int(n))},
                          {"role": "assistant", "content": "Done."}]} for n in words]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    seq_length = 40
    processor = load_processor(default_processor_path(), 4096)
    lengths = [len(processor({**row, "sample_id": i})["input_ids"]) for i, row in enumerate(rows)]
    truncated = [i for i, length in enumerate(lengths) if length > seq_length]
    assert 1 < len(truncated) < len(rows)
    status, stdout, stderr = analyze_here(["--dataset", str(tmp_path / "rows.jsonl"), "--seq-length", str(seq_length), "--micro-batch-size", "4",
                                           "--steps", "2", "--quiet", "--out", str(tmp_path / "out")])
    assert status == 0, stderr
    warnings = [line for line in stdout.splitlines() if line.startswith("warnings:")]
    assert warnings == [f"warnings: {len(truncated)} samples truncated to --seq-length (later turns first, then the prompt's start and the reply's end; "
        "every image placeholder kept; "
                        f"first: dataset row {truncated[0]})"]
    assert "truncated" not in stderr


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    from matplotlib import pyplot as plt

    plt.close("all")
