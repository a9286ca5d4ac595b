"""The docs run: every ```python block of docs/*.md and README.md and the cheap `mimo-pipes analyze`
command blocks (in one fresh interpreter, each block in its own namespace: tests/helpers/doc_blocks.py), every
documented configuration error against the code, the index of docs/ and every path a page cites."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mimo_pipes.cli.commands import run_cmd
from mimo_pipes.cli.main import build_parser
from mimo_pipes.config.flags import flag_names
from mimo_pipes.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
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
RUNNER = ROOT / "tests" / "helpers" / "doc_blocks.py"


def test_there_are_python_blocks_to_run():
    assert len(PYTHON_BLOCKS) >= 8


def runnable_blocks(page: Path) -> list[dict]:
    """The page's ```python blocks and its `mimo-pipes analyze` command blocks (cheap: they run too), in order."""
    jobs = []
    for number, match in enumerate(FENCE.finditer(page.read_text())):
        language, code = match.group(1), match.group(2)
        name = f"{page.relative_to(ROOT)}#{number}"
        if language == "python":
            jobs.append({"name": name, "kind": "python", "code": code})
        elif language == "bash" and code.startswith("mimo-pipes analyze"):
            jobs.append({"name": name, "kind": "command", "code": code})
    return jobs


def run_blocks(jobs: list[dict], tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Every job in one fresh interpreter (tests/helpers/doc_blocks.py), in order; its exit and one result per job run."""
    jobs_file, results_file = tmp_path / "jobs.json", tmp_path / "results.jsonl"
    jobs_file.write_text(json.dumps(jobs))
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1", DOCS_TMP=str(tmp_path))
    process = subprocess.run([sys.executable, str(RUNNER), str(jobs_file), str(results_file), *extra], cwd=ROOT,
                             capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S * len(jobs), env=env)
    results = [json.loads(line) for line in results_file.read_text().splitlines()] if results_file.exists() else []
    return process, results


RUNNABLE = {str(page.relative_to(ROOT)): jobs for page in PAGES if (jobs := runnable_blocks(page))}


def test_every_python_block_is_run():
    assert [job["name"] for jobs in RUNNABLE.values() for job in jobs if job["kind"] == "python"] == [name for name, _ in PYTHON_BLOCKS]
    assert sum(job["kind"] == "command" for jobs in RUNNABLE.values() for job in jobs) >= 2


@pytest.fixture(scope="module")
def docs_run(request, tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    """The blocks of every page selected for test_page_blocks_run, in one fresh interpreter, in page order:
    its exit, and the result of every block by name."""
    selected = {item.callspec.params["page"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_page_blocks_run" and item.module is request.module}
    jobs = [job for page, page_jobs in RUNNABLE.items() if page in selected for job in page_jobs]
    process, results = run_blocks(jobs, tmp_path_factory.mktemp("docs"))
    return process, {result["name"]: result for result in results}


@pytest.mark.launch  # every page's blocks in one fresh interpreter
@pytest.mark.parametrize("page", list(RUNNABLE))
def test_page_blocks_run(page, docs_run):
    """A page's blocks, each in its own namespace (as `python -c` runs it), in the interpreter every page
    shares; analyze commands in a scratch folder each, so --out lands there and must hold analysis.json."""
    process, results = docs_run
    output = (process.stdout + process.stderr)[-3000:]
    jobs = RUNNABLE[page]
    assert [job["name"] for job in jobs if job["name"] not in results] == [], output  # the interpreter stopped short
    failures = [f"{job['name']}: {results[job['name']]['error']}" for job in jobs if not results[job["name"]]["ok"]]
    assert not failures, "\n".join(failures)
    assert process.returncode == (0 if all(result["ok"] for result in results.values()) else 1), output
    for job in jobs:
        if job["kind"] == "command":
            assert list(Path(results[job["name"]]["folder"]).rglob("analysis.json")), job["name"]


@pytest.mark.launch  # a fresh interpreter runs the blocks
def test_a_failing_block_fails_its_page(tmp_path):
    """Blocks share an interpreter, not names; a raise, a non-zero exit or a thread left running (here one
    that never ends) fails the block (and so its page), the blocks after it still run, and the run ends."""
    jobs = [
        {"name": "defines", "kind": "python", "code": "value = 1\n"},
        {"name": "leans on it", "kind": "python", "code": "print(value)\n"},
        {"name": "exits 3", "kind": "python", "code": "import sys\nsys.exit(3)\n"},
        {"name": "exits 0", "kind": "python", "code": "import sys\nsys.exit(0)\n"},
        {"name": "bad command", "kind": "command", "code": "mimo-pipes analyze --steps 0 --out analysis\n"},
        {"name": "leaves a thread", "kind": "python",
         "code": "import threading\nthreading.Thread(target=threading.Event().wait, name='stray').start()\n"},
        {"name": "after it", "kind": "python", "code": "print('still runs')\n"},
    ]
    process, results = run_blocks(jobs, tmp_path, "0.2")
    assert process.returncode == 1
    outcome = {result["name"]: result["error"] for result in results}
    assert list(outcome) == [job["name"] for job in jobs]
    assert outcome["defines"] is None and outcome["exits 0"] is None and outcome["after it"] is None
    assert "NameError: name 'value' is not defined" in outcome["leans on it"]
    assert outcome["exits 3"] == "exited with status 3"
    assert outcome["bad command"] == "exited with status 2"
    assert "thread 'stray'" in outcome["leaves a thread"]


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
        with flag_names():  # the command's checks: settings named by their flags
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


# ---- the pages' index and the paths they cite ----

DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
TOP_LEVEL = ("mimo_pipes/", "mimo_pipes_recipes/", "benchmarks/", "recipes/", "tests/", "docs/", "scripts/")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)


def prose(text: str) -> str:
    """The page without its fenced blocks: code in a block is an example, not a citation."""
    return FENCE.sub("", text)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(heading) for heading in HEADING.findall(prose(page.read_text()))}


def cited_path(span: str) -> str | None:
    """The repository path a code span cites, if it is one: it starts at a top-level folder (a file,
    folder or glob), or it is a bare `something.py` of the package."""
    word = span.strip()
    if " " in word or "{" in word or "<" in word:
        return None
    word = word.split("::")[0].rstrip(":,")
    if word.startswith(TOP_LEVEL):
        return word
    if re.fullmatch(r"[\w/]+\.py", word):
        return word
    return None


def exists(path: str) -> bool:
    """A path from the root (or from the package: `cli/job/launcher.py`); a bare file name, as pages cite a
    module inside the package or script they are describing, anywhere in the repository's code folders."""
    if path.startswith("mimo_pipes_recipes/"):
        path = "recipes/" + path.removeprefix("mimo_pipes_recipes/")
    if "/" not in path:
        return any(any(ROOT.glob(f"{folder}**/{path}")) for folder in TOP_LEVEL if (ROOT / folder).is_dir())
    candidates = [path] if path.startswith(TOP_LEVEL) else [path, f"mimo_pipes/{path}"]
    return any(any(ROOT.glob(candidate)) if "*" in candidate else (ROOT / candidate).exists() for candidate in candidates)


def module_exists(dotted: str) -> bool:
    """`mimo_pipes.a.b.name`: the package's first level at least is a module or package, and every further
    level that is one exists (the rest are names inside it)."""
    parts = dotted.split(".")
    base = ROOT / ("recipes" if parts[0] == "mimo_pipes_recipes" else "mimo_pipes")
    if len(parts) == 1:
        return base.is_dir()
    level = base
    for depth, part in enumerate(parts[1:]):
        if (level / part).is_dir():
            level = level / part
        elif (level / f"{part}.py").exists():
            return True
        else:
            return depth > 0 and (level / "__init__.py").exists()
    return True


def broken_citations(page: Path) -> list[str]:
    text = prose(page.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, fragment = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        if not linked.exists():
            broken.append(f"link {target}")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"link {target} (no such heading)")
    for span in CODE_SPAN.findall(text):
        path = cited_path(span)
        if path is not None and not exists(path):
            broken.append(f"path `{span}`")
        word = span.strip().split("(")[0]
        if re.fullmatch(r"mimo_pipes(_recipes)?(\.\w+)+", word) and not module_exists(word):
            broken.append(f"module `{span}`")
    return broken


def test_the_index_links_every_page():
    linked = {(DOCS / target.partition("#")[0]).resolve() for target in LINK.findall(INDEX.read_text())}
    missing = [page.name for page in sorted(DOCS.glob("*.md")) if page != INDEX and page.resolve() not in linked]
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_every_cited_path_exists(page):
    assert broken_citations(page) == []


def test_the_citation_check_sees_a_broken_one(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nSee `mimo_pipes/gone.py`, `benchmarks/exchange.py`, `cli/job.py`, `gone.py`, [a](missing.md),\n"
                    "[b](#title), [c](#nothing), `mimo_pipes.cli.job.recipe.load_recipe`, `mimo_pipes.nowhere`, `tests/*/test_*.py`.\n"
                    "```text\n`mimo_pipes/in_a_block.py`\n```\n")
    assert broken_citations(page) == ["link missing.md", "link #nothing (no such heading)", "path `mimo_pipes/gone.py`",
                                      "path `benchmarks/exchange.py`", "path `cli/job.py`", "path `gone.py`", "module `mimo_pipes.nowhere`"]


def test_every_benchmark_script_is_documented():
    """docs/benchmarks.md names every script under benchmarks/ (and, by the check above, only scripts that exist)."""
    text = (DOCS / "benchmarks.md").read_text()
    scripts = sorted(path.name for path in (ROOT / "benchmarks").iterdir() if path.suffix in (".py", ".sh"))
    assert [name for name in scripts if f"`{name}" not in text and f"benchmarks/{name}" not in text] == []
