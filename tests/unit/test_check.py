"""`mimo-pipes check`: every bad row of a dataset named once with its place and reason, counted per reason;
exit 1 with bad rows, 0 without, 2 for bad configuration; the same output whatever the number of workers."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from mimo_pipes.cli.main import main
from mimo_pipes.data import bad_rows
from mimo_pipes.data.bad_rows.row_check import RowChecker
from mimo_pipes.data.embedded.builtin_processor import default_processor_path
from mimo_pipes.data.processing.processor import load_processor

SEQ_LENGTH = 256


def check(*argv: str) -> tuple[int, list[str], str]:
    """``mimo-pipes check ARGV`` in this process: (exit status, stdout lines, stderr)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(["check", "--quiet", *argv])
    return status, stdout.getvalue().splitlines(), stderr.getvalue()


def llava(image, text: str = "<image>\nWhat is it?", reply: str | None = "A card.", **extra) -> dict:
    turns = [{"from": "human", "value": text}] + ([{"from": "gpt", "value": reply}] if reply is not None else [])
    return {"image": image, "conversations": turns, **extra}


def png(size: tuple[int, int], colour: str = "white") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


# Every kind of bad row, by id, with the kind its line names ("cut" only when images are decoded in full).
BAD = {
    "missing": bad_rows.MISSING_IMAGE,
    "corrupt": bad_rows.UNREADABLE_IMAGE,
    "outside": bad_rows.OUTSIDE_IMAGE_FOLDER,
    "no-reply": bad_rows.NO_REPLY,
    "count": bad_rows.IMAGE_COUNT,
    "content": bad_rows.MALFORMED_CONVERSATION,
    "huge": bad_rows.IMAGES_TOO_LONG,
    "cut": bad_rows.UNREADABLE_IMAGE,
}


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory) -> Path:
    """``data/rows.jsonl`` with a row of every bad kind, a malformed line and a truncated (not bad) row,
    ``data/empty.jsonl``, images under ``data/img``."""
    root = tmp_path_factory.mktemp("bad") / "data"
    (root / "img").mkdir(parents=True)
    (root / "img" / "ok.png").write_bytes(png((120, 80)))
    (root / "img" / "wide.png").write_bytes(png((900, 900)))  # 841 placeholders: more than --seq-length
    (root / "img" / "corrupt.png").write_bytes(b"not an image at all")
    noise = io.BytesIO()
    Image.effect_noise((300, 300), 60).convert("RGB").save(noise, format="PNG")
    (root / "img" / "cut.png").write_bytes(noise.getvalue()[: len(noise.getvalue()) // 2])  # its header reads, its pixels do not
    (root / "secret.png").write_bytes(png((50, 50)))
    rows = [
        llava("ok.png", id="good-0"),
        llava("missing.png", id="missing"),
        llava("corrupt.png", id="corrupt"),
        None,  # a malformed line
        llava("../secret.png", id="outside"),
        llava("ok.png", id="no-reply", reply=None),
        llava("ok.png", text="<image>\n<image>\nAnd these two?", id="count"),
        {"id": "content", "messages": [{"role": "user", "content": 42}, {"role": "assistant", "content": "Yes."}]},
        llava("wide.png", id="huge"),
        llava("cut.png", id="cut"),
        llava("ok.png", text="<image>\n" + "say it again " * 80, id="long"),  # truncated: not bad
        llava("ok.png", id="good-1"),
    ]
    lines = ['{"id": "broken", "image": ' if row is None else json.dumps(row) for row in rows]
    (root / "rows.jsonl").write_text("\n".join(lines) + "\n")
    (root / "empty.jsonl").write_text("")
    return root


def expected_lines(root: Path, decode: bool) -> list[str]:
    """The listing's lines that name the bad rows, as ``prefix: kind`` (the reasons follow)."""
    lines = [f"{root}/empty.jsonl: {bad_rows.EMPTY_FILE}"]
    ids = [None if line.startswith('{"id": "broken"') else json.loads(line)["id"] for line in (root / "rows.jsonl").read_text().splitlines()]
    for number, ident in enumerate(ids, start=1):
        where = f"{root}/rows.jsonl line {number} (dataset row {number - 1})"
        if ident is None:
            lines.append(f"{where}: {bad_rows.INVALID_JSON}")
        elif ident in BAD and (decode or ident != "cut"):
            lines.append(f"{where}, id {ident!r}: {BAD[ident]}")
    return lines


def listing(stdout: list[str]) -> list[str]:
    """The lines naming bad rows and files, each cut after its kind."""
    named = [line for line in stdout[1:] if not line.startswith(("bad:", "truncated:", "costs:", " "))]
    kinds = sorted(vars(bad_rows).values(), key=lambda kind: -len(kind) if isinstance(kind, str) else 0)
    cut = []
    for line in named:
        kind = next(k for k in kinds if isinstance(k, str) and f": {k}: " in line)
        cut.append(line[: line.index(f": {kind}: ") + len(kind) + 2])
    return cut


@pytest.mark.parametrize("decode", [True, False], ids=["decode", "headers"])
def test_every_bad_row_is_named_once_with_its_reason_then_counted(bad_data, decode):
    status, stdout, stderr = check("--dataset", f"{bad_data}/*.jsonl", "--image-folder", str(bad_data / "img"),
                                   "--seq-length", str(SEQ_LENGTH), "--num-workers", "1", *(["--decode"] if decode else []))
    assert status == 1, stderr
    assert stdout[0].startswith(f"mimo-pipes check: {bad_data}/*.jsonl: 12 rows; processor embedded (qwen2-vl), --seq-length {SEQ_LENGTH}")
    assert listing(stdout) == expected_lines(bad_data, decode)
    by_id = {line.split("id '")[1].split("'")[0]: line for line in stdout if ", id '" in line}
    assert "'missing.png' does not exist under the image folder" in by_id["missing"] and "--image-folder" in by_id["missing"]
    assert "cannot be decoded" in by_id["corrupt"]  # the header path finds it too: no header, and processing fails
    assert "content must be a string or a list of parts, got int 42" in by_id["content"]
    assert "the conversation names 2 images but the row has 1" in by_id["count"]
    bad = 9 if decode else 8
    summary = stdout[stdout.index(next(line for line in stdout if line.startswith("bad:"))):]
    assert summary[0] == f"bad: {bad} of 12 rows; 1 of 2 files"
    counted = {line.split(maxsplit=1)[1]: int(line.split()[0]) for line in summary[1:] if line.startswith(" ")}
    assert counted == {**{kind: 1 for kind in (bad_rows.MISSING_IMAGE, bad_rows.OUTSIDE_IMAGE_FOLDER, bad_rows.NO_REPLY, bad_rows.IMAGE_COUNT,
                                               bad_rows.MALFORMED_CONVERSATION, bad_rows.IMAGES_TOO_LONG, bad_rows.INVALID_JSON)},
                       bad_rows.UNREADABLE_IMAGE: 2 if decode else 1, f"{bad_rows.EMPTY_FILE} (files)": 1}
    truncated = [line for line in summary if line.startswith("truncated:")]
    assert len(truncated) == 1 and truncated[0].startswith(f"truncated: 1 row gives way to --seq-length {SEQ_LENGTH}, not bad")
    assert f"first: {bad_data}/rows.jsonl line 11 (dataset row 10)" in truncated[0]


def test_clean_data_passes_with_exit_0(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(png((64, 48)))
    Image.new("RGB", (200, 90), "red").save(tmp_path / "images" / "b.jpg")
    rows = [llava("a.png", id=0), llava({"path": "b.jpg", "bytes": None}, id=1),
            {"images": ["b.jpg", "a.png"], "messages": [
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Compare."}, {"type": "image"}]},
                {"role": "assistant", "content": "The left is red."}]},
            {"prompt": "Say hi.", "response": "Hi."}]
    (tmp_path / "rows.json").write_text(json.dumps(rows))  # a LLaVA-style list
    status, stdout, stderr = check("--dataset", str(tmp_path / "rows.json"), "--image-folder", str(tmp_path / "images"), "--decode")
    assert status == 0, stderr
    assert stdout[1:] == ["bad: none of 4 rows"]


def test_rows_of_parquet_parts_are_named_by_file_and_row(tmp_path):
    chat = [{"role": "user", "content": "Describe."}, {"role": "assistant", "content": "Gray."}]
    pq.write_table(pa.table({"images": [[png((40, 40))]] * 3, "messages": [chat] * 3}), tmp_path / "part-0.parquet")
    pq.write_table(pa.table({"images": [[png((40, 40))], [b"broken bytes"]], "messages": [chat] * 2}), tmp_path / "part-1.parquet")
    status, stdout, _ = check("--dataset", str(tmp_path / "part-*.parquet"), "--num-workers", "1")
    assert status == 1
    assert listing(stdout) == [f"{tmp_path}/part-1.parquet row 1 (dataset row 4): {bad_rows.UNREADABLE_IMAGE}"]
    assert stdout[-2:] == ["bad: 1 of 5 rows", f"       1  {bad_rows.UNREADABLE_IMAGE}"]


@pytest.mark.launch  # fresh processes of the command, with worker processes
def test_the_output_is_the_same_on_one_and_two_workers(tmp_path):
    """200 rows (four batches), a bad one in each of several batches: the same lines, in the same order."""
    (tmp_path / "ok.png").write_bytes(png((90, 60)))
    rows = [llava("ok.png", id=k) if k % 37 else llava(f"gone-{k}.png", id=k) for k in range(200)]
    rows[150] = llava("ok.png", id=150, reply=None)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    outputs = [check("--dataset", str(tmp_path / "rows.jsonl"), "--num-workers", workers) for workers in ("1", "2")]
    assert outputs[0][0] == outputs[1][0] == 1
    assert outputs[0][1] == outputs[1][1]
    assert len(listing(outputs[0][1])) == len([k for k in range(200) if k % 37 == 0]) + 1


@pytest.mark.parametrize("argv, flag", [
    (["--dataset", "nowhere/*.jsonl"], "--dataset"),
    (["--seq-length", "0"], "--seq-length"),
    (["--image-folder", "/nonexistent"], "--image-folder"),
    (["--num-workers", "0"], "--num-workers"),
    (["--processor", "/nonexistent"], "--processor"),
])
def test_bad_configuration_exits_2_with_one_line_naming_the_flag(bad_data, argv, flag):
    given = dict(zip(argv[::2], argv[1::2]))
    dataset = given.pop("--dataset", str(bad_data / "rows.jsonl"))
    status, stdout, stderr = check("--dataset", dataset, *[item for pair in given.items() for item in pair])
    assert status == 2 and stdout == []
    assert len(stderr.strip().splitlines()) == 1 and stderr.startswith(f"mimo-pipes check: error: {flag}: ")


def test_a_source_datasets_cannot_read_for_no_line_of_its_own_is_bad_configuration(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"prompt": "p", "response": "r"}) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "p"}, {"role": "assistant", "content": "r"}]}) + "\n")
    status, _, stderr = check("--dataset", str(tmp_path / "*.jsonl"))  # the files' columns differ: no run can read them
    assert status == 2 and stderr.startswith("mimo-pipes check: error: --dataset: cannot read")


@pytest.fixture(scope="module")
def processor():
    return load_processor(default_processor_path(), 64)


def test_a_truncated_row_is_good_and_says_how_long_it_was(processor):
    long = {"sample_id": 0, "prompt": "tell me " * 40, "response": "fine."}
    verdict = RowChecker(processor)(long)
    assert not verdict.bad and verdict.truncated_from == len(load_processor(default_processor_path(), 4096)(dict(long))["input_ids"]) > 64
    assert RowChecker(processor)({"sample_id": 1, "prompt": "hi", "response": "fine."}).truncated_from is None


def test_a_row_no_header_sizes_is_processed_as_the_run_would(processor, monkeypatch):
    monkeypatch.setattr(type(processor.family), "image_grid", lambda *args: (_ for _ in ()).throw(ValueError("no rule here")))
    row = {"sample_id": 0, "images": [png((60, 40))], "prompt": "what?", "response": "white."}
    verdict = RowChecker(processor)(row)
    assert not verdict.bad and verdict.processed == "ValueError: no rule here"
