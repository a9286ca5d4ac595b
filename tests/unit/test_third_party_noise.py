"""Other libraries' noise stays off a job's terminal where the library opens data: no datasets progress
bar ("Generating train split"), no torchdata ``set_vital`` deprecation warning; their errors still show
and their settings are as they were afterwards."""

from __future__ import annotations

import json
import warnings

import datasets
import pytest

from mimo_pipes.data.sources.open_source import open_source
from mimo_pipes.errors import ConfigError
from mimo_pipes.observe.third_party import quiet_known_warnings


def _rows(path, count: int) -> str:
    rows = [{"messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"Answer {i}."}]} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_opening_a_json_source_draws_no_progress_bar(tmp_path, capfd):
    datasets.utils.enable_progress_bars()
    verbosity = datasets.logging.get_verbosity()
    dataset = open_source(_rows(tmp_path / "rows.jsonl", 20))  # a new file: datasets generates its split
    assert len(dataset) == 20
    captured = capfd.readouterr()
    assert "Generating train split" not in captured.err + captured.out
    assert not datasets.utils.are_progress_bars_disabled() and datasets.logging.get_verbosity() == verbosity  # as they were


def test_a_bad_source_is_still_an_error(tmp_path):
    (tmp_path / "rows.jsonl").write_text("{not json\n")
    with pytest.raises(ConfigError, match="^dataset: "):
        open_source(str(tmp_path / "rows.jsonl"))


def test_stateful_dataloader_says_nothing_about_set_vital():
    from torchdata.stateful_dataloader import StatefulDataLoader

    def construct(quiet: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if quiet:
                quiet_known_warnings()  # what importing mimo_pipes installs
            StatefulDataLoader(list(range(4)), batch_size=None)
        return [str(w.message) for w in caught]

    assert any("set_vital" in message for message in construct(quiet=False))  # torchdata does warn
    assert not any("set_vital" in message for message in construct(quiet=True))
