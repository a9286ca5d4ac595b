"""``mimo-pipes balance`` as a filter: the JSON-lines contract of docs/design.md, through a real process."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mimo_pipes.balance import balance_microbatch, balance_window, objective


def _command() -> list[str]:
    script = Path(sys.executable).with_name("mimo-pipes")
    if script.exists():
        return [str(script), "balance"]
    found = shutil.which("mimo-pipes")
    if found:
        return [found, "balance"]
    return [sys.executable, "-m", "mimo_pipes.cli.main", "balance"]


def run_balance(stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        _command(), input=stdin, capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )


MICRO = {"costs": [900, 0, 64, 4096, 256, 256, 1369, 0], "slots": 4}
WINDOW = {"costs": [[5000, 64, 0, 0], [64, 64, 2000, 300], [0, 0, 1, 9000]], "slots": 2}


def test_both_forms_one_line_per_request():
    lines = [
        json.dumps(MICRO),
        "",  # blank lines are skipped
        json.dumps({**WINDOW, "across_microbatches": True}),
        json.dumps(WINDOW),
        json.dumps({**WINDOW, "across_microbatches": False}),
        json.dumps({"costs": [3, 1, 2], "slots": 1}),
    ]
    proc = run_balance("\n".join(lines) + "\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(out) == 5

    slots = out[0]["slots"]
    assert slots == balance_microbatch(MICRO["costs"], 4)
    assert sorted(i for s in slots for i in s) == list(range(8))
    assert all(len(s) == 2 for s in slots)
    assert objective(MICRO["costs"], slots)[0] == 4096  # the heaviest sample with a zero: optimal

    across = out[1]["microbatches"]
    assert across == balance_window(WINDOW["costs"], 2, across_microbatches=True)
    assert sorted(i for mb in across for s in mb for i in s) == list(range(12))
    assert all(len(mb) == 2 and all(len(s) == 2 for s in mb) for mb in across)

    assert out[2] == out[3] == {"microbatches": balance_window(WINDOW["costs"], 2)}
    for m, mb in enumerate(out[2]["microbatches"]):
        assert sorted(i for s in mb for i in s) == list(range(4 * m, 4 * m + 4))
    assert out[4] == {"slots": [[0, 1, 2]]}


BAD_LINES = [
    ("{not json", "invalid JSON"),
    ('{"costs": [1, 2, 3], "slots": 2}', "not divisible"),
    ('{"costs": [1, -2], "slots": 1}', "must be >= 0"),
    ('{"costs": [1, 2.5], "slots": 1}', "must be an integer"),
    ('{"costs": [1, true], "slots": 2}', "must be an integer"),
    ('{"slots": 2}', "missing key 'costs'"),
    ('{"costs": [1, 2]}', "missing key 'slots'"),
    ('{"costs": [1, 2], "slots": 0}', "slots must be an integer >= 1"),
    ('{"costs": [1, 2], "slots": "2"}', "slots must be an integer >= 1"),
    ('{"costs": [[1, 2], [3]], "slots": 1}', "same size"),
    ('{"costs": [[1, 2], 3], "slots": 1}', "not a mix"),
    ('{"costs": [1, 2], "slots": 1, "across_microbatches": true}', "needs nested costs"),
    ('{"costs": [1, 2], "slots": 1, "across_microbatches": "yes"}', "true or false"),
    ('{"costs": [1, 2], "slots": 1, "slot": 1}', "unknown key 'slot'"),
    ('[1, 2]', "expected a JSON object"),
    ('{"costs": ' + "[" * 50_000 + "]" * 50_000 + ', "slots": 1}', "nested too deeply"),
    ('{"costs": [1], "slots": 1, "x": ' + '{"a": ' * 50_000 + "0" + "}" * 50_001, "nested too deeply"),
]
GOOD = json.dumps({"costs": [1, 2, 3, 4], "slots": 2})
GOOD_OUT = json.dumps({"slots": [[0, 3], [1, 2]]}, separators=(",", ":"))


@pytest.mark.parametrize("bad, fragment", BAD_LINES)
def test_bad_line_in_process(bad, fragment):
    from mimo_pipes.cli.commands.balance_cmd import serve

    stdin = io.BytesIO(f"{GOOD}\n\n{bad}\n{GOOD}\n".encode())
    stdout, stderr = io.StringIO(), io.StringIO()
    assert serve(stdin, stdout, stderr) == 2
    assert stdout.getvalue().splitlines() == [GOOD_OUT]
    err = stderr.getvalue().splitlines()
    assert len(err) == 1
    assert "line 3" in err[0] and fragment in err[0], err[0]


def test_bad_line_exit_2_one_stderr_line():
    proc = run_balance(f"{GOOD}\n\n{{\"costs\": [1, -2], \"slots\": 1}}\n{GOOD}\n")
    assert proc.returncode == 2
    assert proc.stdout.splitlines() == [GOOD_OUT]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr
    assert "line 3" in err[0] and "must be >= 0" in err[0]
    assert "Traceback" not in proc.stderr


def test_deeply_nested_json_exit_2_one_stderr_line():
    proc = run_balance(GOOD + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    assert proc.returncode == 2
    assert proc.stdout.splitlines() == [GOOD_OUT]
    assert proc.stderr.strip() == "mimo-pipes balance: line 2: JSON nested too deeply"


def test_invalid_utf8_is_a_bad_line():
    from mimo_pipes.cli.commands.balance_cmd import serve

    stderr = io.StringIO()
    assert serve(io.BytesIO(b"\xff\xfe\n"), io.StringIO(), stderr) == 2
    assert "line 1" in stderr.getvalue() and "UTF-8" in stderr.getvalue()


def test_the_command_line_parser_imports_no_torch():
    """`mimo-pipes balance` starts in a fraction of a second: building every command's parser imports no torch."""
    code = "import sys; from mimo_pipes.cli.main import build_parser; build_parser(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
