"""The architecture as the tree shows it: only the exchange package talks to other ranks, the library never
imports the command line, and the pure modules reach nothing that moves bytes."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mimo_pipes"
# The one package that moves bytes (its world module starts the process group).
ALLOWED = ("exchange/",)


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``), at any depth."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _imports_distributed(path: Path) -> bool:
    return any(name == "torch.distributed" or name.startswith("torch.distributed.") for name in _imports(path))


def test_only_the_exchange_package_imports_torch_distributed() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if _imports_distributed(path) and not relative.startswith(ALLOWED):
            offenders.append(relative)
    assert offenders == []


def test_the_check_sees_an_import_where_there_is_one() -> None:
    assert _imports_distributed(PACKAGE / "exchange" / "collectives.py")
    assert _imports_distributed(PACKAGE / "exchange" / "world.py")
    assert not _imports_distributed(PACKAGE / "balance" / "microbatch.py")
    assert "mimo_pipes.observe.summary" in _imports(PACKAGE / "analysis" / "analyze.py")


def test_the_library_never_imports_the_command_line() -> None:
    offenders = [
        path.relative_to(PACKAGE).as_posix()
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.relative_to(PACKAGE).as_posix().startswith("cli/")
        and any(name == "mimo_pipes.cli" or name.startswith("mimo_pipes.cli.") for name in _imports(path))
    ]
    assert offenders == []


def test_the_library_never_imports_megatron() -> None:
    """Process groups come from the topology (a test holds them equal to megatron-core's HyperCommGrid)."""
    offenders = [path.relative_to(PACKAGE).as_posix() for path in sorted(PACKAGE.rglob("*.py"))
                 if any(name.split(".")[0] == "megatron" for name in _imports(path))]
    assert offenders == []


def test_pure_packages_import_nothing_that_moves_bytes() -> None:
    """balance/, time_model/ and the plain modules never reach into the exchange package."""
    plain = ("topology.py", "sharding.py", "cost.py", "collate.py", "metrics.py", "observer.py", "summary.py", "tail_settings.py")
    pure = [*sorted((PACKAGE / "balance").glob("*.py")), *sorted((PACKAGE / "time_model").glob("*.py")), *(PACKAGE / name for name in plain)]
    for path in pure:
        assert not any(name.startswith("mimo_pipes.exchange") for name in _imports(path)), path.name
