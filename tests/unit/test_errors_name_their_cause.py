"""Failures name their cause in one line: JSON errors (no "starting at at character"), a full disk (the file,
not the folder), metadata lists of the wrong length, non-integer token fields, and every setting a resume
refuses to change (saved, requested and why)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_plugin_dist import single_rank_batches

from mimo_pipes.checkpoint import generation as generation_module
from mimo_pipes.checkpoint.generation import open_generation
from mimo_pipes.cli.commands.balance_cmd import serve
from mimo_pipes.cli.job import resume_checks as settings_module
from mimo_pipes.cli.job.resume_checks import WHY, resume_settings
from mimo_pipes.cli.rank.state_save import _os_error
from mimo_pipes.config import PipelineConfig, ReorderConfig
from mimo_pipes.config.flags import flag_names
from mimo_pipes.config.job_options import JobOptions, TrainOptions
from mimo_pipes.errors import ConfigError, SampleError, json_error_text
from mimo_pipes.nodes.uncollate import Uncollate
from mimo_pipes.samples.checks import check_collatable, check_sample
from mimo_pipes.samples.collate import collate_microbatch
from mimo_pipes.samples.sample import INTEGER_FIELDS
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset

# --- JSON errors -------------------------------------------------------------------------------------

BROKEN_JSON = ['{"a": "unterminated', '{"a": 1,, "b": 2}', '{"a": "tab\tin string"}', '[1, 2', '{"a": \\u}', '', '{"a": 1} x', '{"a" 1}']


@pytest.mark.parametrize("text", BROKEN_JSON)
def test_json_errors_read_as_one_phrase(text):
    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads(text)
    for line in (True, False):
        phrase = json_error_text(caught.value, line=line)
        assert " at at " not in phrase and not phrase.endswith(" at")
        assert phrase.startswith(caught.value.msg) and f"column {caught.value.colno}" in phrase
        assert ("line " in phrase) == line


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet='{}[]":,\\ \tab01etrunl', max_size=24))
def test_every_decoder_message_reads_as_one_phrase(text):
    try:
        json.loads(text)
    except json.JSONDecodeError as error:
        phrase = json_error_text(error)
        assert " at at " not in phrase and f"line {error.lineno} column {error.colno}" in phrase


def test_a_cut_manifest_names_where_it_stops(tmp_path):
    (tmp_path / "manifest.json").write_text('{"format": 3, "generation": "ab')
    with pytest.raises(ConfigError) as caught:
        open_generation(tmp_path)
    message = str(caught.value)
    assert "Unterminated string starting at line 1 column 29" in message and " at at " not in message


@pytest.mark.parametrize(("line", "problem"), [
    (b'{"costs": "ab', "Unterminated string starting at column 11"),
    (b'{"costs": "a\tb"}\n', "Invalid control character at column 13"),  # the line's own newline ends it, inside no string
    (b'{"costs" [1]}', "Expecting ':' delimiter at column 10"),
])
def test_balance_names_a_bad_json_line_in_one_phrase(line, problem):
    stdout, stderr = io.StringIO(), io.StringIO()
    status = serve(io.BytesIO(b'{"costs": [1, 2], "slots": 2}\n' + line), stdout, stderr)
    assert status == 2
    assert stderr.getvalue() == f"mimo-pipes balance: line 2: invalid JSON: {problem}\n"


# --- a full disk names the file ----------------------------------------------------------------------


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device that is always full)")
def test_a_full_disk_names_the_file_not_the_folder():
    with pytest.raises(OSError) as caught:
        generation_module._write_file(Path("/dev/full"), b"x" * 100)
    assert caught.value.filename == "/dev/full"
    assert _os_error(caught.value, "/some/state/folder") == "could not write /dev/full (No space left on device)"


# --- metadata lists and token dtypes -----------------------------------------------------------------


def _split(batch):
    node = Uncollate(iter([]), image_token_id=IMAGE_TOKEN_ID, rows_per_batch=4)
    return node.split(batch, 0)


@pytest.mark.parametrize("name", ["sample_ids", "image_tokens", "slots", "costs", "real_tokens"])
@pytest.mark.parametrize("change", [-1, 1])
def test_a_metadata_list_of_the_wrong_length_is_named(name, change):
    batch = next(single_rank_batches())
    batch[name] = list(range(100, 104 + change))
    with pytest.raises(ValueError) as caught:
        _split(batch)
    assert str(caught.value) == f"micro-batch 0: metadata list {name!r} has {4 + change} entries, expected one per row (4)"


def test_a_repeated_sample_id_is_two_rows_not_one():
    # A sampler drawing with replacement (or a bad row replaced by the next good one) repeats an id: each row
    # stays its own sample, told apart by its place.
    batch = next(single_rank_batches())
    batch["sample_ids"] = [7, 7, 8, 9]
    samples = _split(batch)
    assert [sample["sample_id"] for sample in samples] == [7, 7, 8, 9]
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    assert [int(sample["input_ids"].shape[-1]) for sample in samples] == lengths
    assert torch.equal(samples[1]["input_ids"], batch["input_ids"][1, : lengths[1]])


def test_metadata_lists_of_the_right_length_split():
    batch = next(single_rank_batches())
    batch["sample_ids"] = [7, 8, 9, 10]
    assert [sample["sample_id"] for sample in _split(batch)] == [7, 8, 9, 10]


NARROW = [torch.float32, torch.float16, torch.bool, torch.int8, torch.uint8, torch.int16]  # uint8 labels wrap -100 to 156


@pytest.mark.parametrize("name", INTEGER_FIELDS)
@pytest.mark.parametrize("dtype", NARROW)
def test_non_integer_token_fields_are_refused_naming_field_and_sample(name, dtype):
    dataset = SyntheticProcessedDataset(8, seed=4)
    samples = [{**dataset[i], "sample_id": i, "step": 0} for i in range(3)]
    samples[1][name] = samples[1][name].to(dtype)
    attempts = (lambda: collate_microbatch(samples, pad_length=None), lambda: check_collatable(samples, None), lambda: check_sample(samples[1]))
    for attempt in attempts:
        with pytest.raises(SampleError) as caught:
            attempt()
        assert caught.value.sample_id == 1 and caught.value.field == name
        assert f"must be an int32 or int64 tensor, got {dtype}" in str(caught.value)


def _plugged(batches, **overrides):
    """The first micro-batches the single-rank plug-in adapter makes of ``batches`` (no ranks needed)."""
    from test_plugin_dist import wrap_single

    with wrap_single(iter(batches), **overrides) as wrapped:
        return [next(wrapped) for _ in range(len(batches))]


def _bad_batch(change):
    batches = [next(single_rank_batches(step)) for step in range(2)]
    change(batches[1])
    return batches


def _scaled_grid(batch):
    batch["image_grid_thw"] = batch["image_grid_thw"] * torch.tensor([1, 2, 1])


def _negated_grid(batch):
    batch["image_grid_thw"] = -batch["image_grid_thw"]


# Bad inputs through the adapter that splits collated micro-batches: each was silent or a bare error before.
ADAPTER_INPUTS = {
    "sample_ids of strings": (lambda b: b.update(sample_ids=["a", "b", "c", "d"]), ValueError,
                              "micro-batch 1: sample_ids[0] must be an integer, got 'a' (str)"),
    "sample_ids of floats": (lambda b: b.update(sample_ids=[1.5, 2.5, 3.5, 4.5]), ValueError, "sample_ids[0] must be an integer, got 1.5 (float)"),
    "sample_ids of bools": (lambda b: b.update(sample_ids=[True, False, True, False]), ValueError, "sample_ids[0] must be an integer, got True (bool)"),
    "bool input_ids": (lambda b: b.update(input_ids=b["input_ids"].bool()), SampleError,
                       "field 'input_ids': micro-batch 1: must be an int32 or int64 tensor, got torch.bool"),
    "int8 input_ids": (lambda b: b.update(input_ids=b["input_ids"].to(torch.int8)), SampleError, "must be an int32 or int64 tensor, got torch.int8"),
    "uint8 labels": (lambda b: b.update(labels=b["labels"].to(torch.uint8)), SampleError, "field 'labels': micro-batch 1: must be an int32 or int64"),
    "an attention mask a row short": (lambda b: b.update(attention_mask=b["attention_mask"][:3]), ValueError,
                                      "micro-batch 1: field 'attention_mask' has 3 rows but input_ids has 4"),
    "a grid as a list": (lambda b: b.update(image_grid_thw=b["image_grid_thw"].tolist()), ValueError,
                         "micro-batch 1: field 'image_grid_thw' must be a tensor of rows concatenated over the micro-batch, got a list"),
    "a 1-D grid": (lambda b: b.update(image_grid_thw=b["image_grid_thw"].flatten()), ValueError,
                   "micro-batch 1: field 'image_grid_thw' must be an integer [images, 3] tensor of (t, h, w)"),
    "a grid twice the patches": (_scaled_grid, SampleError,
                                 "sample 4, field 'image_grid_thw': describes 2384 patches but the sample has 1192 rows of pixel_values"),
    "a negative grid": (_negated_grid, SampleError, "sample 4, field 'image_grid_thw': has a (t, h, w) row below 1"),
    "vision_rows a row short": (lambda b: b["vision_rows"].update(pixel_values=b["vision_rows"]["pixel_values"][:3]), ValueError,
                                "micro-batch 1: vision_rows['pixel_values'] has 3 entries, expected one per row (4)"),
}


@pytest.mark.parametrize("case", ADAPTER_INPUTS)
def test_bad_inputs_through_the_adapter_name_the_field(case):
    change, kind, words = ADAPTER_INPUTS[case]
    with pytest.raises(kind) as caught:
        _plugged(_bad_batch(change))
    assert words in str(caught.value) and "\n" not in str(caught.value)


def _sample(**changes):
    dataset = SyntheticProcessedDataset(8, seed=4)
    sample = {**dataset[next(i for i in range(8) if "image_grid_thw" in dataset[i])], "sample_id": 5, "step": 2}
    for key, value in changes.items():
        if value is None:
            del sample[key]
        else:
            sample[key] = value(sample) if callable(value) else value
    return sample


# Bad samples from a plug-in's own nodes (balanced_loader), refused where they enter the tail.
SAMPLE_INPUTS = {
    "no step": (dict(step=None), "sample 5, field 'step': is missing"),
    "a float step": (dict(step=2.5), "sample 5, field 'step': must be an integer, got 2.5 (float)"),
    "no sample id": (dict(sample_id=None), "sample None, field 'sample_id': is missing (a sample of step 2)"),
    "a float sample id": (dict(sample_id=5.5), "sample 5.5, field 'sample_id': must be an integer, got 5.5 (float)"),
    "labels 3 short": (dict(labels=lambda s: s["labels"][:-3]), "field 'labels': has"),
    "a grid twice the patches": (dict(image_grid_thw=lambda s: s["image_grid_thw"] * torch.tensor([1, 2, 1])), "field 'image_grid_thw': describes"),
    "pixels with a leading 1": (dict(pixel_values=lambda s: s["pixel_values"].unsqueeze(0)), "but the sample has 1 rows of pixel_values"),
    "int16 position ids": (dict(position_ids=lambda s: s["position_ids"].to(torch.int16)), "field 'position_ids': must be an int32 or int64"),
    "int64 pixels": (dict(pixel_values=lambda s: s["pixel_values"].long()), "field 'pixel_values': must be floating point"),
    "uint8 pixels": (dict(pixel_values=lambda s: s["pixel_values"].to(torch.uint8)), "field 'pixel_values': must be floating point"),
    "bool pixels": (dict(pixel_values=lambda s: s["pixel_values"].bool()), "field 'pixel_values': must be floating point"),
}


@pytest.mark.parametrize("case", SAMPLE_INPUTS)
def test_bad_samples_entering_the_tail_name_the_sample_and_field(case):
    from torchdata.nodes import IterableWrapper

    from mimo_pipes.config.tail_settings import resolve_tail
    from mimo_pipes.nodes import CostAnnotator

    changes, words = SAMPLE_INPUTS[case]
    settings = resolve_tail(ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True), micro_batch_size=1, dp_size=1, grid_size=1,
                            image_token_ids=IMAGE_TOKEN_ID, pad_length=4096, pad_values={"labels": -100})
    with pytest.raises(SampleError) as caught:
        next(CostAnnotator(IterableWrapper([_sample(**changes)]), settings=settings))
    assert words in str(caught.value), str(caught.value)


def test_good_samples_pass_the_entry_check():
    check_sample(_sample())
    check_sample(_sample(input_ids=lambda s: s["input_ids"].to(torch.int32), sample_id=np.int64(5)))


def test_integer_token_fields_of_any_width_collate():
    dataset = SyntheticProcessedDataset(8, seed=4)
    samples = [{**dataset[i], "sample_id": i, "step": 0} for i in range(3)]
    samples[0]["input_ids"] = samples[0]["input_ids"].to(torch.int32)
    assert collate_microbatch(samples, pad_length=None)["input_ids"].shape[0] == 3


# --- resume refusals say why ---------------------------------------------------------------------------


@pytest.mark.parametrize("options", [JobOptions(), TrainOptions()], ids=["run", "train"])
def test_every_setting_a_resume_compares_says_why(options):
    assert set(resume_settings(PipelineConfig(), options)) <= set(WHY)


@pytest.mark.parametrize(("saved", "requested"), [("rows", "samples"), ("samples", "rows")])
def test_switching_the_payload_on_resume_names_both_and_why(monkeypatch, saved, requested):
    class Saved:
        settings = resume_settings(PipelineConfig(exchange_payload=saved), JobOptions())
        consumed = 3

    monkeypatch.setattr(settings_module, "open_generation", lambda directory: Saved())
    with pytest.raises(ConfigError) as caught, flag_names():  # the command's check: it names flags
        settings_module.check_resume_dir("STATE", PipelineConfig(exchange_payload=requested), 4, JobOptions())
    message = str(caught.value)
    assert message.startswith(f"--resume: STATE was saved with --exchange-payload {saved}, this run has {requested}: ")
    assert message.endswith(WHY["exchange_payload"])


# --- a lost peer, in one line --------------------------------------------------------------------------

GLOO_RESET = "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:52014: Connection reset by peer"
GLOO_CLOSED = "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation to complete"


@pytest.mark.parametrize(("text", "cause"), [
    (GLOO_RESET, "connection reset by peer"),
    ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:41197", "connection closed by peer"),
    (GLOO_CLOSED, "timed out waiting for a peer"),
    ("NCCL communicator was aborted on rank 3", "NCCL communicator aborted"),
])
def test_a_transport_failure_becomes_one_line_without_its_text(text, cause):
    from mimo_pipes.cli.job.peer_loss import lost_peer_line
    from mimo_pipes.errors import PeerError

    raw = lost_peer_line("mimo-pipes run", 3, RuntimeError(text))
    assert raw == f"mimo-pipes run: rank 3: stopped: a peer rank exited or stopped answering during a collective ({cause})"
    wrapped = PeerError(None, f"the exchange's all_to_all failed ({text}); a peer rank may have exited or stalled past the timeout")
    line = lost_peer_line("mimo-pipes run", 1, wrapped)
    assert line == (f"mimo-pipes run: rank 1: a peer rank failed: the exchange's all_to_all failed; a peer rank may have exited "
                    f"or stalled past the timeout ({cause})")
    try:  # raised from one: the chain is searched
        raise ValueError("the save could not finish") from RuntimeError(text)
    except ValueError as error:
        assert lost_peer_line("mimo-pipes run", 0, error) is not None


@pytest.mark.parametrize("error", [
    SampleError(4, "is missing while other samples of its micro-batch have it", field="labels"),
    ConfigError("--exchange-timeout", "must be > 0"),
    RuntimeError("CUDA out of memory"),
    ValueError("a timeout of 0 is not allowed"),  # a timeout, but no transport's text
])
def test_other_errors_are_not_a_lost_peer(error):
    from mimo_pipes.cli.job.peer_loss import lost_peer_line

    assert lost_peer_line("mimo-pipes run", 0, error) is None


# --- every output file names itself when a write fails -------------------------------------------------


class _FullFile(io.StringIO):
    """Stands for a file on a full disk: its writes fail as the OS fails them, naming no file."""

    def write(self, text):
        raise OSError(28, "No space left on device")


def test_a_dump_that_runs_out_of_space_names_its_file(tmp_path):
    from mimo_pipes.cli.rank.assignment_dump import AssignmentDump

    dump = AssignmentDump(JobOptions(dump_assignments=str(tmp_path / "dumps")), rank=3)
    dump.file.close()
    dump.file = _FullFile()
    with pytest.raises(ConfigError) as caught:
        dump.write({"step": 0})
    assert str(caught.value) == f"--dump-assignments: could not write {tmp_path / 'dumps' / 'rank3.jsonl'} (No space left on device)"
    dump.close()  # nothing left to flush


def test_a_summary_json_that_cannot_be_written_names_its_file(tmp_path, monkeypatch):
    from mimo_pipes.cli.rank.report import write_summary_json

    def full(self, text, *args, **kwargs):
        raise OSError(27, "File too large")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(ConfigError) as caught:
        write_summary_json(str(tmp_path / "summary.json"), [], {})
    assert str(caught.value) == f"--summary-json: could not write {tmp_path / 'summary.json'} (File too large)"


# --- a JSON line cut at its end is named at its column, not at "column 1" of a line 2 ------------------


@pytest.mark.parametrize(("line", "problem"), [(b"[1,\n", "Expecting value at column 4"), (b'{"costs": [1, 2]\r\n', "Expecting ',' delimiter at column 17")])
def test_balance_names_the_column_where_a_line_is_cut(line, problem):
    stdout, stderr = io.StringIO(), io.StringIO()
    assert serve(io.BytesIO(line), stdout, stderr) == 2
    assert stderr.getvalue() == f"mimo-pipes balance: line 1: invalid JSON: {problem}\n"


def test_a_dataset_line_cut_at_its_end_is_named_at_its_column(tmp_path):
    from mimo_pipes.data.sources.open_source import why_unreadable

    data = tmp_path / "rows.jsonl"
    data.write_text('{"messages": []}\n{"messages": [\n')
    problem = why_unreadable("json", [str(data)], ValueError("datasets could not read it"))
    assert problem == f"{data} line 2: invalid JSON: Expecting value at column 15", problem
