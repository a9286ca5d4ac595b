"""`--help` of every subcommand: each flag says what it does and, where it has a default value, names it."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys

import pytest

from mimo_pipes.cli.main import build_parser

HELPS = ("", "run", "analyze", "check", "train", "balance", "calibrate")  # "": the top level's
# The CLI's own `main` in one fresh interpreter (one a command cost 0.2 s of CPU each): every `--help` as the command
# line prints it on a pipe, with its exit status.
_PRINT_HELPS = """
import contextlib, io, json, sys
from mimo_pipes.cli.main import main
helps = {}
for command in sys.argv[1:]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            main([*command.split(), "--help"])
        status = None
    except SystemExit as stop:
        status = stop.code
    helps[command] = [status, out.getvalue()]
print(json.dumps(helps))
"""


@functools.cache  # one fresh interpreter, however many tests read the helps
def _helps() -> dict[str, str]:
    result = subprocess.run([sys.executable, "-c", _PRINT_HELPS, *HELPS], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    helps = json.loads(result.stdout)
    assert {command: status for command, (status, _) in helps.items()} == dict.fromkeys(HELPS, 0)  # each --help exits 0
    return {command: text for command, (_, text) in helps.items()}


def help_text(command: str) -> str:
    """``mimo-pipes COMMAND --help`` as printed (``""``: the top level's)."""
    return _helps()[command]


def option_entries(text: str) -> dict[str, str]:
    """``{--flag: its help text}`` from argparse's ``options:`` section."""
    section = text.split("\noptions:\n", 1)[1]
    entries: dict[str, str] = {}
    current = None
    for line in section.splitlines():
        if line.startswith("  -"):  # "  -h, --help  text" or "  --flag VALUE" with the text on the next lines
            invocation, _, text = line.strip().partition("  ")
            current = max(re.findall(r"--?[\w-]+", invocation), key=len)
            entries[current] = text
        elif current and line.startswith("    "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return {name: " ".join(value.split()) for name, value in entries.items()}


def subparser(command: str):
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices[command]


@pytest.mark.parametrize("command", ["run", "analyze", "check", "train", "balance", "calibrate"])
def test_every_flag_says_what_it_does_and_its_default(command):
    entries = option_entries(help_text(command))
    actions = [a for a in subparser(command)._actions if a.option_strings]
    assert {max(a.option_strings, key=len) for a in actions} == set(entries)
    for action in actions:
        name = max(action.option_strings, key=len)
        text = entries[name]
        assert len(text) > 10, f"{name} has no help"
        takes_value = action.nargs != 0
        if action.required:
            assert text.endswith("(required)"), f"{name} is required and does not say so: {text!r}"
        elif takes_value:
            assert "(default: " in text, f"{name} does not name its default: {text!r}"
        if takes_value and action.default is not None:
            shown = str(action.default).lower() if isinstance(action.default, bool) else str(action.default)
            if isinstance(action.default, tuple):  # lists are written as they are typed
                shown = ",".join(map(str, action.default))
            assert f"(default: {shown})" in text, f"{name}: {text!r}"


def test_run_help_names_the_default_layout():
    entries = option_entries(help_text("run"))
    assert "(default: language=dp=2 + images=dp=2,rank_offset=2)" in entries["--component"]


def test_the_top_level_help_lists_every_command_in_plain_text():
    from mimo_pipes.cli.main import COMMANDS

    text = help_text("")
    assert text.startswith("usage: mimo-pipes [-h] COMMAND ...")
    for name, (_, summary) in COMMANDS.items():
        assert f"  {name:<10} {summary}" in text.splitlines()
    assert "`" not in text


@pytest.mark.parametrize("command, words", [("analyze", "Offline, in one process"), ("train", "Train a tiny non-colocated MIMO model"),
                                            ("check", "Check every row of a dataset as a run would process it")])
def test_each_command_describes_itself(command, words):
    text = help_text(command)
    assert words in text and "Run the balanced MIMO input pipeline" not in text


def test_check_takes_only_the_flags_it_uses():
    assert set(option_entries(help_text("check"))) == {"--help", "--dataset", "--processor", "--image-folder", "--split-part", "--seq-length", "--decode",
                                                       "--num-workers", "--quiet"}


def test_drop_last_offers_only_the_value_it_accepts():
    assert "--drop-last {true}" in help_text("run")


@pytest.mark.parametrize("argv, suggestion", [(["run", "--reorder-windw-size", "2"], "did you mean --reorder-window-size?"),
                                               (["anlyze"], "did you mean analyze?"),
                                               (["analyze", "--out", "x", "--compare-window-size", "2"], "did you mean --compare-window-sizes?")])
def test_a_mistyped_command_or_flag_gets_a_suggestion(argv, suggestion, capsys):
    from mimo_pipes.cli.main import main

    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2 and capsys.readouterr().err.strip().endswith(suggestion)


def test_each_commands_usage_line_names_only_that_command():
    from mimo_pipes.cli.main import COMMANDS, build_parser

    for name in COMMANDS:
        usage = build_parser()._subparsers._group_actions[0].choices[name].format_usage()
        assert usage.startswith(f"usage: mimo-pipes {name} [-h]"), usage
