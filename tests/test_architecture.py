"""The architecture as the tree shows it: only the exchange package and the launcher talk to other ranks."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mimo_pipes"
# The one package that moves bytes, and the job that starts the process group.
ALLOWED = ("exchange/", "cli/job.py")


def _imports_distributed(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import) and any(alias.name.startswith("torch.distributed") for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module.startswith("torch.distributed"):
                return True
            if node.module == "torch" and any(alias.name == "distributed" for alias in node.names):
                return True
    return False


def test_only_the_exchange_package_and_the_launcher_import_torch_distributed() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if _imports_distributed(path) and not relative.startswith(ALLOWED):
            offenders.append(relative)
    assert offenders == []


def test_the_check_sees_an_import_where_there_is_one() -> None:
    assert _imports_distributed(PACKAGE / "exchange" / "collectives.py")
    assert _imports_distributed(PACKAGE / "cli" / "job.py")
    assert not _imports_distributed(PACKAGE / "balance" / "microbatch.py")


def test_pure_packages_import_nothing_that_moves_bytes() -> None:
    """balance/ and the plain modules never reach into the exchange package."""
    plain = ("topology.py", "sharding.py", "cost.py", "collate.py", "metrics.py", "observer.py")
    pure = [*sorted((PACKAGE / "balance").glob("*.py")), *(PACKAGE / name for name in plain)]
    for path in pure:
        tree = ast.parse(path.read_text())
        modules = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
        assert not any(module.startswith("mimo_pipes.exchange") for module in modules), path.name
