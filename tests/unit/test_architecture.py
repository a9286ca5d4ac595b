"""The architecture as the tree shows it: only the exchange package talks to other ranks, the library never
imports the command line, and the pure modules reach nothing that moves bytes."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from source_trees import parsed

PACKAGE = Path(__file__).resolve().parents[2] / "mimo_pipes"
# The one package that moves the pipeline's bytes (its world module starts the process group), and the demo
# trainer's model code, whose collectives carry activations and gradients, never samples.
ALLOWED = ("exchange/", "demo_model/")


def _tree(path: Path) -> ast.Module:
    return parsed(path)  # every check reads the same tree: each file is parsed once a run


@functools.cache
def _imports(path: Path) -> tuple[str, ...]:
    """Every module ``path`` imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``), at any depth."""
    names: list[str] = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return tuple(names)


def _imports_distributed(path: Path) -> bool:
    return any(name == "torch.distributed" or name.startswith("torch.distributed.") for name in _imports(path))


def test_only_the_exchange_package_and_the_demo_trainer_import_torch_distributed() -> None:
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


def _imports_megatron(names: tuple[str, ...] | list[str]) -> bool:
    """megatron-core, that is: megatron-energon (the optional extra that reads Energon datasets) is apart."""
    return any(name.split(".")[0] == "megatron" and not name.startswith("megatron.energon") for name in names)


def _imports_energon(names: tuple[str, ...] | list[str]) -> bool:
    return any(name.startswith("megatron.energon") for name in names)


def _module_level_imports(path: Path) -> list[str]:
    """The modules ``path`` imports when it is imported (its top-level statements, not function bodies)."""
    names: list[str] = []
    for node in _tree(path).body:
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.append(node.module)
    return names


def test_only_the_megatron_package_imports_megatron() -> None:
    """Process groups come from the topology (a test holds them equal to megatron-core's HyperCommGrid); the
    batches megatron-core takes are made in megatron/, which needs megatron-core only to read its signatures."""
    offenders = [path.relative_to(PACKAGE).as_posix() for path in sorted(PACKAGE.rglob("*.py"))
                 if _imports_megatron(_imports(path)) and not path.relative_to(PACKAGE).as_posix().startswith("megatron/")]
    assert offenders == []


def test_the_megatron_package_imports_megatron_core_only_when_called() -> None:
    """mimo_batch and the rest work without megatron-core loaded: it is imported inside functions only."""
    package = sorted((PACKAGE / "megatron").glob("*.py"))
    assert any(_imports_megatron(_imports(path)) for path in package)  # the check sees the lazy import
    assert [path.name for path in package if _imports_megatron(_module_level_imports(path))] == []


def test_only_the_energon_source_imports_megatron_energon() -> None:
    """megatron-energon is an optional extra: the Energon source's files alone import it."""
    users = [path.relative_to(PACKAGE).as_posix() for path in sorted(PACKAGE.rglob("*.py")) if _imports_energon(_imports(path))]
    assert users and all(name.startswith("data/sources/energon_") for name in users), users


def test_pure_packages_import_nothing_that_moves_bytes() -> None:
    """The pure rooms (planners, time model, layout arithmetic, samples, observation) and the tail's settings never
    reach into the exchange package."""
    rooms = ("balance", "time_model", "parallel", "samples", "observe")
    pure = [*(path for room in rooms for path in sorted((PACKAGE / room).rglob("*.py"))), PACKAGE / "config" / "tail_settings.py"]
    assert len(pure) > 30
    for path in pure:
        assert not any(name.startswith("mimo_pipes.exchange") for name in _imports(path)), path.name


def _rooms_in_tree() -> set[str]:
    rooms = {f"mimo_pipes/{path.parent.name}/" for path in PACKAGE.glob("*/__init__.py")}
    modules = {f"mimo_pipes/{path.name}" for path in PACKAGE.glob("*.py") if path.name != "__init__.py"}
    return rooms | modules


def _rooms_in_section(text: str, heading: str) -> set[str]:
    section = text.split(heading, 1)[1]
    section = section.split("\n#", 1)[0]
    return set(re.findall(r"`(mimo_pipes/(?:\w+/|\w+\.py))`", section))


def test_the_layout_sections_list_every_room_of_the_tree() -> None:
    """README's Layout and design.md's "Where the code lives" name every room and top module, and no other."""
    tree = _rooms_in_tree()
    assert len(tree) >= 15
    readme = (PACKAGE.parent / "README.md").read_text()
    design = (PACKAGE.parent / "docs" / "design.md").read_text()
    assert _rooms_in_section(readme, "## Layout\n") == tree
    assert {name for name in _rooms_in_section(design, "### Where the code lives\n") if name.count("/") == 1 or name.endswith("/")} == tree


def test_the_top_level_holds_a_handful_of_modules() -> None:
    assert len([path for path in PACKAGE.glob("*.py") if path.name != "__init__.py"]) <= 5


def test_the_exchange_and_analyze_reach_the_planners_through_one_entry() -> None:
    """The choice among planners (one level, two levels, a saved composition) lives in balance/assign.py."""
    planners = {"balance_window", "balance_two_level", "balance_composition", "balance_composition_two_level"}
    for path in (PACKAGE / "exchange" / "collectives.py", PACKAGE / "analysis" / "replay.py"):
        names = _imports(path)
        assert "mimo_pipes.balance.assign.assign_window" in names or "mimo_pipes.balance.assign_window" in names, path.name
        assert not any(name.rsplit(".", 1)[-1] in planners for name in names), path.name


def _collating_files() -> set[str]:
    """Files that call a collator's ``window()`` or ``microbatch()`` (a receiver named like ``collator``)."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("window", "microbatch"):
                receiver = node.func.value
                name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
                if "collator" in name.lower():
                    found.add(path.relative_to(PACKAGE).as_posix())
    return found


def test_collation_has_one_home() -> None:
    """One node collates, whatever the payload, reordering or packing: the graph's window collator."""
    assert _collating_files() == {"nodes/window_collator.py"}


def test_checking_before_the_exchange_lives_apart_from_collating() -> None:
    """samples/collate.py only collates: it defines no check, and nothing imports a check from it; what is checked
    before the exchange comes from samples/checks.py."""
    tree = ast.parse((PACKAGE / "samples" / "collate.py").read_text())
    defined = [node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and "check" in node.name]
    assert defined == []
    checkout = [path for top in sorted(PACKAGE.parent.iterdir()) if top.is_dir() and not top.name.startswith(".")
                for path in sorted(top.rglob("*.py"))]  # never the virtual environments (.venv, .venv312)
    # Only a file that names the module can import from it: the others are not parsed (most of the checkout).
    naming = [path for path in checkout if "mimo_pipes.samples.collate" in path.read_text(errors="replace")]
    from_collate = [f"{path.relative_to(PACKAGE).as_posix()}: {name}" for path in naming for name in _imports(path)
                    if name.startswith("mimo_pipes.samples.collate.") and "check" in name.rsplit(".", 1)[-1]]
    assert from_collate == []
    for user in ("nodes/cost_annotator.py", "nodes/balance_exchange.py"):
        assert any(name.startswith("mimo_pipes.samples.checks.check_") for name in _imports(PACKAGE / user)), user


def test_nodes_ask_nothing_of_their_source_behind_the_data() -> None:
    """What a node tells the node before it travels with the data (a window's record) or through the loader:
    no node looks up methods on its source by name, and the loader tells nodes through typed hooks."""
    offenders = []
    for path in sorted((PACKAGE / "nodes").glob("*.py")) + [PACKAGE / "graph" / "loader.py"]:
        text = path.read_text()
        if re.search(r"getattr\(self\.source,", text) or re.search(r"getattr\([a-z_]+, \"(start_at|confirm|fail|pin|start_position)\"", text):
            offenders.append(path.name)
    assert offenders == []


REPO = PACKAGE.parent
# Beside the package: recipe files (installed as mimo_pipes_recipes) and benchmarks, each one room.
OUTSIDE = {"recipes": "mimo_pipes_recipes", "benchmarks": "benchmarks"}


def _room_of_module(name: str) -> str | None:
    """The room a dotted module name lies in: a top-level folder or module of mimo_pipes, or recipes, benchmarks."""
    parts = name.split(".")
    if parts[0] == "mimo_pipes":
        return parts[1] if len(parts) > 1 and ((PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").is_file()) else None
    return next((room for room, package in OUTSIDE.items() if parts[0] in (room, package)), None)


def _room_of_path(path: Path) -> str:
    relative = path.relative_to(REPO)
    return relative.parts[1].removesuffix(".py") if relative.parts[0] == "mimo_pipes" else relative.parts[0]


def _room_arrows() -> dict[str, set[str]]:
    """Room -> the other rooms its files import, at any depth (imports inside functions count)."""
    paths = [path for path in PACKAGE.rglob("*.py") if path.parent != PACKAGE or path.name != "__init__.py"]
    paths += [path for room in OUTSIDE for path in (REPO / room).glob("*.py")]
    arrows: dict[str, set[str]] = {}
    for path in paths:
        room = _room_of_path(path)
        targets = {_room_of_module(name) for name in _imports(path)} - {None, room}
        arrows.setdefault(room, set()).update(target for target in targets if target is not None)
    return arrows


def _cycle(arrows: dict[str, set[str]]) -> list[str]:
    """A cycle of rooms (empty: none), by depth-first search."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(room: str) -> list[str]:
        state[room] = 1
        path.append(room)
        for target in sorted(arrows.get(room, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        state[room] = 2
        path.pop()
        return []

    for room in sorted(arrows):
        if room not in state and (found := visit(room)):
            return found
    return []


def test_the_rooms_import_each_other_without_a_cycle() -> None:
    """Rooms stack in floors: no room reaches, through any chain of imports, back to itself (the library, the
    recipes and the benchmarks, each an upper floor of the one before)."""
    arrows = _room_arrows()
    assert {"cli", "config", "data", "recipes", "benchmarks"} <= set(arrows)
    assert "megatron" in arrows["recipes"] and "recipes" in arrows["benchmarks"]  # the check sees arrows where they are
    assert "cli" not in arrows["recipes"]  # the command line loads recipes: a recipe importing it would close a loop
    assert _cycle(arrows) == []
    assert not any({"recipes", "benchmarks"} & arrows[room] for room in arrows if room not in OUTSIDE)


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []
