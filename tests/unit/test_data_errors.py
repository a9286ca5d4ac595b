"""Data errors with their place: the file and line, or the dataset row, and the cause; ``~`` in path flags;
the skip report's distinct rows, each with its reason, and its attempts counted apart."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mimo_pipes.cli.job.args import add_job_arguments, config_from_args
from mimo_pipes.cli.main import build_parser
from mimo_pipes.config import PipelineConfig
from mimo_pipes.data.bad_rows.skipping import REPLACED_REASONS, REPLACED_ROWS, SkipBadRows
from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.processor import load_processor
from mimo_pipes.data.sources.open_source import check_source, open_source
from mimo_pipes.errors import ConfigError, SampleError
from mimo_pipes.observe.bad_rows_report import format_skip_report, skipped_rows
from mimo_pipes.samples.sample import SAMPLE_ID, SLOT, STEP

CHAT = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def _line(row: dict) -> str:
    return json.dumps(row) + "\n"


# ----------------------------------------------------------------------------------------------------
# Sources: the file and line, or both files and the column


def test_an_empty_json_lines_file_is_named(tmp_path):
    (tmp_path / "rows.jsonl").write_text("")
    with pytest.raises(ConfigError, match=r"^dataset: .*rows\.jsonl holds no rows \(the file is empty\)$"):
        open_source(str(tmp_path / "rows.jsonl"))


def test_a_malformed_line_is_named_with_its_number(tmp_path):
    (tmp_path / "rows.jsonl").write_text(_line({"messages": CHAT}) * 2 + '{"messages": [oops\n' + _line({"messages": CHAT}))
    with pytest.raises(ConfigError, match=r"^dataset: .*rows\.jsonl line 3: invalid JSON: Expecting value at column 15$"):
        open_source(str(tmp_path / "rows.jsonl"))


def test_a_malformed_annotation_list_is_named_with_its_line(tmp_path):
    (tmp_path / "llava.json").write_text('[\n {"conversations": []},\n {"conversations": [}\n]\n')
    with pytest.raises(ConfigError, match=r"^dataset: .*llava\.json line 3: invalid JSON: "):
        open_source(str(tmp_path / "llava.json"))


def test_parts_whose_columns_conflict_are_named_with_the_column(tmp_path):
    pq.write_table(pa.table({"images": [[b"png"]], "messages": [CHAT]}), tmp_path / "part-0.parquet")
    pq.write_table(pa.table({"images": [[{"bytes": b"png", "path": "a.png"}]], "messages": [CHAT]}), tmp_path / "part-1.parquet")
    with pytest.raises(ConfigError) as info:
        open_source(str(tmp_path / "part-*.parquet"))
    message = str(info.value)
    assert message.startswith("dataset: ") and "\n" not in message
    assert "part-1.parquet" in message and "part-0.parquet" in message and "column 'images'" in message
    assert "list<element: binary>" in message and "An error occurred while generating the dataset" not in message


# ----------------------------------------------------------------------------------------------------
# ~ in path flags


def test_home_is_expanded_in_every_path_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "rows.jsonl").write_text(_line({"messages": CHAT}) * 8)
    (tmp_path / "images").mkdir()
    check_source("~/rows.jsonl")
    assert len(open_source("~/rows.jsonl")) == 8
    args = build_parser().parse_args(["run", "--dataset", "~/rows.jsonl", "--image-folder", "~/images", "--processor", "~/proc",
                                      "--dump-assignments", "~/dumps", "--resume", "~/state", "--save-state", "~/saved",
                                      "--reorder-cost-model", "~/model.json", "--tensorboard", "~/tb"])
    config, options = config_from_args(args)
    assert (config.dataset, config.image_folder, config.processor) == (f"{tmp_path}/rows.jsonl", f"{tmp_path}/images", f"{tmp_path}/proc")
    assert config.reorder.reorder_cost_model == f"{tmp_path}/model.json"
    assert (options.dump_assignments, options.resume, options.save_state, options.tensorboard) == tuple(
        f"{tmp_path}/{name}" for name in ("dumps", "state", "saved", "tb"))
    PipelineConfig(dataset="~/rows.jsonl", image_folder="~/images").validate()  # a trainer's own config too
    assert add_job_arguments  # the flags above are the job's (run, analyze and train share them)


# ----------------------------------------------------------------------------------------------------
# Content of the wrong type: a bad row, skippable


@pytest.mark.parametrize("message, where", [
    ({"role": "user", "content": 42}, "message 0: content must be a string or a list of parts, got int 42"),
    ({"role": "user", "content": [{"type": "text", "text": 42}]}, "message 0: text must be a string, got int 42"),
    ({"role": "user", "content": {"type": "text"}}, "message 0: content must be a string or a list of parts, got dict"),
])
def test_content_of_the_wrong_type_is_a_bad_row(message, where):
    processor = load_processor(default_processor_path(), 256)
    with pytest.raises(SampleError, match=f"dataset row 5: {where}") as info:
        processor({SAMPLE_ID: 5, "messages": [message, CHAT[1]]})
    assert info.value.field == "messages"


def test_a_row_of_numbers_from_json_lines_is_skipped_with_its_reason(tmp_path):
    lines = [_line({"messages": CHAT})] * 4
    lines[1] = _line({"messages": [{"role": "user", "content": 42}, CHAT[1]]})
    (tmp_path / "rows.jsonl").write_text("".join(lines))
    dataset = open_source(str(tmp_path / "rows.jsonl"))
    processor = load_processor(default_processor_path(), 256)
    skip = SkipBadRows(processor, dataset, micro_batch_size=4, seed=0, dataloader_type="single")
    sample = skip({**dataset[1], SAMPLE_ID: 1, STEP: 0, SLOT: 0})
    assert sample[SAMPLE_ID] == 2 and sample[REPLACED_ROWS] == [1]
    assert sample[REPLACED_REASONS] == ["message 0: content must be a string or a list of parts, got int 42"]
    assert skip({**dataset[0], SAMPLE_ID: 0, STEP: 0, SLOT: 0})[REPLACED_REASONS] == []


# ----------------------------------------------------------------------------------------------------
# The skip report


def _record(module, dp_rank, step, replaced, tp_rank=0):
    return {"module": module, "dp_rank": dp_rank, "step": step, "tp_rank": tp_rank, "pp_rank": 0, "replaced_rows": replaced}


def test_the_skip_report_lists_each_bad_row_once_with_its_reason_and_counts_attempts_apart():
    bad = {1: "image 0 'a.png' cannot be decoded", 5: "no assistant text to train on", 9: "outside the image folder"}
    records = [
        _record("language", 0, 0, [(1, bad[1]), (5, bad[5])]),  # row 1 failed, then its successor 5
        _record("language", 0, 0, [(1, bad[1]), (5, bad[5])], tp_rank=1),  # a tensor-parallel peer: the same micro-batch
        _record("language", 1, 0, [(5, bad[5])]),  # row 5 met again in its own slot
        _record("language", 1, 3, [(9, bad[9])]),
        _record("language", 0, 6, [(1, bad[1])]),  # the next epoch
        _record("images", 0, 0, [(1, bad[1]), (5, bad[5])]),  # every module skips the same rows
    ]
    rows, attempts = skipped_rows(records, "language")
    assert rows == bad and attempts == 5
    report = format_skip_report(rows, attempts)
    lines = report.splitlines()
    assert lines[0] == ("skipped 3 bad dataset row(s) (--skip-bad-samples; 5 attempts to read them), each replaced by the next "
                        "good row of the global order: rows 1, 5, 9")
    assert lines[1:] == [f"  row {row}: {reason}" for row, reason in sorted(bad.items())]
    assert format_skip_report({}, 0) == "skipped 0 bad dataset row(s) (--skip-bad-samples)"
