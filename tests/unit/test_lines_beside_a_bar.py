"""A line said while a progress bar stands unfinished on stderr starts a line of its own: the launcher's lines
and a rank's last words (rank 0's bar runs in another process), and check's report after its bar."""

from __future__ import annotations

import contextlib
import io
import json
import signal
from types import SimpleNamespace

import pytest
from PIL import Image
from tqdm import tqdm

from mimo_pipes.cli.job import launcher
from mimo_pipes.cli.main import main
from mimo_pipes.errors import ConfigError


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _unfinished_bar(stream: io.StringIO) -> None:
    """A bar's output as another process leaves it: drawn, not closed (no newline after it)."""
    bar = tqdm(total=10, desc="micro-batches", file=stream, mininterval=0)
    bar.update(3)
    bar.disable = True  # never closed: its line stays unfinished


def _lines_starting(text: str, words: str) -> list[str]:
    return [line for line in text.split("\n") if line.startswith(words)]


def test_a_launcher_line_after_an_unfinished_bar_starts_a_new_line_in_a_file(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    _unfinished_bar(stream)
    launcher.say("mimo-pipes run: rank 2 was killed by SIGKILL; the other ranks cannot go on without it: stopping them", bar=True)
    assert _lines_starting(stream.getvalue(), "mimo-pipes run: rank 2 was killed by SIGKILL")
    assert "micro-batches" in stream.getvalue()


def test_on_a_terminal_the_bar_line_is_cleared_first(monkeypatch):
    stream = Terminal()
    monkeypatch.setattr("sys.stderr", stream)
    _unfinished_bar(stream)
    launcher.say("mimo-pipes run: rank 2 was killed by SIGKILL", bar=True)
    assert stream.getvalue().endswith("\r\033[Kmimo-pipes run: rank 2 was killed by SIGKILL\n")


def test_without_a_bar_nothing_comes_before_the_line(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    launcher.say("starting 4 ranks")
    assert stream.getvalue() == "starting 4 ranks\n"


def _rank_entry(body, progress: bool) -> int:
    """Rank 1 of 2 running ``body`` as a spawned rank does, with the stop handlers the rank sets restored after."""
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        return launcher.rank_entry(body, 1, 2, None, None, SimpleNamespace(progress=progress), "mimo-pipes run")
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize("progress", [True, False])
def test_a_ranks_last_words_start_their_own_line(monkeypatch, progress):
    monkeypatch.setenv("MIMO_PIPES_SETTING_NAMES", "flags")  # as inside the command, whose ranks name flags
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    _unfinished_bar(stream)

    def failing(rank, world_size, config, options):
        raise ConfigError("--dataset", "no such file")

    status = _rank_entry(failing, progress)
    assert status != 0
    assert bool(_lines_starting(stream.getvalue(), "mimo-pipes run: rank 1: --dataset: no such file")) == progress


def test_checks_first_report_line_is_not_glued_to_its_bar(tmp_path):
    (tmp_path / "ok.png").write_bytes(b"")
    Image.new("RGB", (60, 40), "white").save(tmp_path / "ok.png")
    rows = [{"id": f"r{i}", "image": "ok.png" if i % 5 else "missing.png",
             "conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "A card."}]} for i in range(40)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    both = io.StringIO()  # stdout and stderr in one file, as `mimo-pipes check ... > log 2>&1` writes them
    with contextlib.redirect_stdout(both), contextlib.redirect_stderr(both):
        status = main(["check", "--dataset", str(tmp_path / "rows.jsonl"), "--num-workers", "1", "--seq-length", "256"])
    text = both.getvalue()
    assert status == 1 and "\rcheck:" in text  # the bar was drawn
    assert len(_lines_starting(text, f"{tmp_path / 'rows.jsonl'} line 1 (dataset row 0), id 'r0': missing image")) == 1, text


def test_analyzes_report_is_not_glued_to_its_bars(tmp_path):
    both = io.StringIO()
    with contextlib.redirect_stdout(both), contextlib.redirect_stderr(both):
        status = main(["analyze", "--micro-batch-size", "4", "--embedded-samples", "16", "--steps", "4", "--scalable-dp",
                       "--intra-microbatch-reorder", "--compare-window-sizes", "2", "--no-plots",  # the bars, not the PNGs
                       "--out", str(tmp_path / "out")])
    text = both.getvalue()
    assert status == 0 and "\rcosts:" in text, text  # a bar was drawn
    assert _lines_starting(text, "mimo-pipes analyze: language dp=2 + images dp=2"), text


@pytest.mark.parametrize("failure", ["error", "stop"])
def test_a_stop_signal_landing_as_a_rank_ends_leaves_its_one_line(monkeypatch, failure):
    """The launcher's SIGTERM (sent to every rank once one died) may land as a rank begins to end: its handler then
    raises on the first line of the hold of the stop signals. The rank still says its own ending in one line and
    exits with a status; nothing escapes as a traceback (seen under load: a survivor's line lost)."""
    from mimo_pipes.cli.rank.stop_signal import StopRequested

    monkeypatch.setenv("MIMO_PIPES_SETTING_NAMES", "flags")
    monkeypatch.delenv("MIMO_PIPES_TRACEBACK", raising=False)
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    held = []
    hold = launcher._hold_stop_signals

    def landing_stop() -> None:  # the handler runs on the hold's first line, once
        held.append(len(held))
        if len(held) == 1:
            raise StopRequested(signal.SIGTERM)
        hold()

    monkeypatch.setattr(launcher, "_hold_stop_signals", landing_stop)

    def ending(rank, world_size, config, options):
        if failure == "stop":
            raise StopRequested(signal.SIGTERM)
        raise ConfigError("--dataset", "no such file")

    status = _rank_entry(ending, progress=False)
    assert held == [0, 1]  # held again after the stop that landed
    if failure == "error":
        assert status == launcher.EXIT_FAILED
        assert stream.getvalue().strip().splitlines() == ["mimo-pipes run: rank 1: --dataset: no such file"]
    else:
        assert status == 128 + signal.SIGTERM
