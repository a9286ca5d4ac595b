"""The docs run: every ```python block of docs/*.md and README.md in a fresh interpreter, the cheap
`mimo-pipes analyze` command blocks, and every documented configuration error against the code."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mimo_pipes.cli import run_cmd
from mimo_pipes.cli.main import build_parser
from mimo_pipes.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
LANGUAGES = {"python", "bash", "text", "console", "json"}
BLOCK_TIMEOUT_S = 300  # generous: the machine is shared; each block takes seconds alone


def blocks(language: str) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for number, match in enumerate(FENCE.finditer(page.read_text())):
            if match.group(1) == language:
                found.append((f"{page.relative_to(ROOT)}#{number}", match.group(2)))
    return found


def test_every_fence_names_its_language():
    """An untagged block would be skipped silently: each one says python, bash, text, console or json."""
    untagged = [f"{page.relative_to(ROOT)}: {match.group(0).splitlines()[0]!r}" for page in PAGES
                for match in FENCE.finditer(page.read_text()) if match.group(1) not in LANGUAGES]
    assert untagged == []


PYTHON_BLOCKS = blocks("python")


def test_there_are_python_blocks_to_run():
    assert len(PYTHON_BLOCKS) >= 8


@pytest.mark.parametrize("code", [code for _, code in PYTHON_BLOCKS], ids=[name for name, _ in PYTHON_BLOCKS])
def test_python_block_runs(code, tmp_path):
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1", DOCS_TMP=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, env=env)
    assert result.returncode == 0, result.stderr[-3000:]


ANALYZE_BLOCKS = [(name, code) for name, code in blocks("bash") if code.startswith("mimo-pipes analyze")]


@pytest.mark.parametrize("command", [code for _, code in ANALYZE_BLOCKS], ids=[name for name, _ in ANALYZE_BLOCKS])
def test_analyze_command_block_runs(command, tmp_path):
    """`mimo-pipes analyze` blocks are cheap: run them (in a scratch folder, so --out lands there)."""
    args = shlex.split(command.replace("\\\n", " "))
    result = subprocess.run([sys.executable, "-m", "mimo_pipes.cli.main", *args[1:], "--quiet"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(tmp_path.rglob("analysis.json"))


# ---- docs/configuration.md: every documented violation gives exactly the documented error ----

CONFIGURATION = ROOT / "docs" / "configuration.md"


def documented_errors() -> list[tuple[str, str]]:
    rows = []
    for line in CONFIGURATION.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 6 and cells[4].startswith("`") and cells[5].startswith("`"):
            rows.append((cells[4].strip("`"), cells[5].strip("`")))
    return rows


def configuration_error(args: str) -> str | None:
    parsed = build_parser().parse_args(["run", *shlex.split(args)])
    try:
        config, options = run_cmd.config_from_args(parsed)
        run_cmd.validate_job(config, options)
    except ConfigError as error:
        return str(error)
    return None


def test_the_reference_documents_errors():
    assert len(documented_errors()) >= 30


@pytest.mark.parametrize(("violation", "error"), documented_errors())
def test_documented_error_is_the_real_error(violation, error, monkeypatch):
    monkeypatch.chdir(ROOT)  # relative paths in the table (--resume docs) are the repository's
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    assert configuration_error(violation) == error


def test_every_run_flag_is_in_the_reference():
    text = CONFIGURATION.read_text()
    subcommands = next(action for action in build_parser()._actions if action.dest == "command")
    flags = {option for action in subcommands.choices["run"]._actions for option in action.option_strings if option.startswith("--")}
    missing = sorted(flag for flag in flags - {"--help"} if f"`{flag}" not in text)
    assert missing == []
