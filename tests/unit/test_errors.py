"""SampleError and ConfigError survive the hops torchdata's mappers and pickling make: ``except`` still
matches, and the sample, field and setting are still named."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torchdata.nodes import IterableWrapper, ParallelMapper

from mimo_pipes.errors import ConfigError, SampleError

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def fail_on(bad_id: object, error: Exception):
    def map_fn(item: int) -> int:
        if item == bad_id:
            raise error
        return item

    return map_fn


@pytest.mark.parametrize("method", ["thread", "process"])
def test_sample_error_raised_in_a_mapper_worker_is_a_sample_error(method):
    mapper = ParallelMapper(IterableWrapper(range(10)), fail_on(7, SampleError(7, "bad pixels", field="pixel_values")),
                            num_workers=2, method=method)
    with pytest.raises(SampleError) as info:
        list(mapper)
    assert (info.value.sample_id, info.value.field) == (7, "pixel_values")
    assert str(info.value) == "sample 7, field 'pixel_values': bad pixels"


def test_config_error_raised_in_a_mapper_worker_is_a_config_error():
    mapper = ParallelMapper(IterableWrapper(range(4)), fail_on(2, ConfigError("seq_length", "too short")), num_workers=2)
    with pytest.raises(ConfigError) as info:
        list(mapper)
    assert info.value.setting == "seq_length" and str(info.value) == "seq_length: too short"


@given(
    sample_id=st.one_of(st.integers(), st.text(), st.none()),
    message=st.text(min_size=1).filter(lambda text: "\n" not in text and "\r" not in text),
    field=st.one_of(st.none(), st.text(alphabet="abcdefghij_.[]0123456789", min_size=1)),
)
def test_sample_error_survives_pickling(sample_id, message, field):
    error = SampleError(sample_id, message, field=field)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is SampleError and str(copy) == str(error)
    assert copy.sample_id == sample_id and copy.field == field


@pytest.mark.launch
def test_map_failure_in_run_is_one_line_naming_the_sample():
    result = subprocess.run(
        [sys.executable, "-m", "mimo_pipes.cli.main", "run", "--recipe", "failing_map_recipe", "--quiet",
         "--component", "language=dp=1", "--micro-batch-size", "4", "--steps", "16"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**_env(), "PYTHONPATH": str(TESTS / "helpers")},
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("mimo-pipes run: rank")]
    assert errors == ["mimo-pipes run: rank 0: sample 5, field 'input_ids': cannot be tokenized"], result.stderr


def _env() -> dict[str, str]:
    import os

    return {key: value for key, value in os.environ.items() if key != "MIMO_PIPES_TRACEBACK"}


@pytest.mark.parametrize(("given", "from_python"), [("--dataset", "dataset"), ("--split-part", "split_part"),
                                                    ("--image-folder", "image_folder"), ("--exchange-timeout", "exchange_timeout_s"),
                                                    ("--reorder-window-size", "reorder_window_size"), ("--save", "--save")])
def test_a_setting_raised_by_its_flag_is_named_as_the_caller_wrote_it(monkeypatch, given, from_python):
    # The data sources raise with the flag; a Python caller set the field, a command's user the flag.
    monkeypatch.delenv("MIMO_PIPES_SETTING_NAMES", raising=False)
    error = ConfigError(given, "no such file")
    assert (error.setting, str(error)) == (from_python, f"{from_python}: no such file")
    monkeypatch.setenv("MIMO_PIPES_SETTING_NAMES", "flags")
    error = ConfigError(given, "no such file")
    assert (error.setting, str(error)) == (given, f"{given}: no such file")
