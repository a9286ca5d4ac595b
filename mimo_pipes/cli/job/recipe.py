"""What a recipe module provides, and how ``--recipe`` names one.

A recipe builds one module rank's graph. ``mimo-pipes run``, ``analyze`` and ``train`` call it. What it provides is
written once, as the typing protocols :class:`Recipe` and :class:`Trainer` (a module satisfies a protocol as a class
does: its functions are the protocol's methods without ``self``), and checked once, by :func:`contract_problems`,
when a command loads the recipe (:func:`load_recipe`): every member the command calls is there, and takes what the
command passes. ``--recipe`` takes an importable module name (``mimo_pipes_recipes.vlm_sft``) or the path of a
``.py`` file; every rank loads it the same way.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from mimo_pipes.errors import ConfigError

if TYPE_CHECKING:
    from mimo_pipes.analysis.row_counts import RowCounts
    from mimo_pipes.config import PipelineConfig
    from mimo_pipes.config.job_options import TrainOptions
    from mimo_pipes.exchange import RankLayout
    from mimo_pipes.exchange.process_groups import RankGroups
    from mimo_pipes.graph.loader import GraphLoader
    from mimo_pipes.parallel.topology import Topology

RECIPE_FLAG = "--recipe"
DEFAULT_RECIPE = "mimo_pipes_recipes.vlm_sft"
TRAINING_RECIPE = "mimo_pipes_recipes.tiny_mimo_train"
REQUIRED = ("build",)


class Trainer(Protocol):
    """A training recipe's trainer: one rank's model, optimizer and the loader ``build`` made for it; ``mimo-pipes
    train`` calls ``step()`` once per iteration and saves and restores it whole."""

    def __init__(self, config: PipelineConfig, options: TrainOptions, groups: RankGroups, topology: Topology, loader: GraphLoader) -> None: ...

    @property
    def iteration(self) -> int:
        """Iterations done since the start of training (continues across a resume)."""

    def step(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class Recipe(Protocol):
    """A recipe module, each member as the commands call it (a parameter they pass by keyword may be taken either
    way; more parameters are fine with defaults). ``build`` is what every command calls; the rest as the commands
    need them:

    * ``prepare`` (optional): once, before any rank starts: check the user's paths, build what every rank then only
      loads (the embedded data and processor). Raises ConfigError naming the flag.
    * ``build``: on every rank, its loader, called as ``build(config, layout)`` (the project's recipes also take
      ``consumed_microbatches=``, a Megatron-style count to resume from: for callers of their own).
    * ``row_counts`` (``analyze``): every dataset row's counts as ``build``'s graph would make them;
      ``progress(description, total)`` gives the callback that takes the rows done. With
      ``config.skip_bad_samples`` the rows ``build``'s graph would replace are listed in ``bad_rows`` (row -> why)
      instead of raised, found as the graph finds them under ``config.exchange_payload``.
    * ``failed_after_exchange`` (optional, ``analyze`` under ``--exchange-payload rows`` with
      ``--skip-bad-samples``): which of the dataset ``rows`` consumed would be counted and moved, then fail where
      they are processed (row -> why): the rows the run masks. Without it analyze cannot say.
    * ``Trainer`` (``train``): a class of the :class:`Trainer` protocol; ``check_layout`` (optional) refuses a
      layout it cannot train, before any rank starts.
    """

    Trainer: type[Trainer]

    def prepare(self, config: PipelineConfig, *, log: Callable[[str], None]) -> None: ...

    def build(self, config: PipelineConfig, layout: RankLayout) -> GraphLoader: ...

    def row_counts(self, config: PipelineConfig, *, real_tokens: bool, runs: bool,
                   progress: Callable[[str, int], Callable[[int], None]] | None) -> RowCounts: ...

    def failed_after_exchange(self, config: PipelineConfig, rows: Iterable[int], progress: Callable[[int], None] | None) -> dict[int, str]: ...

    def check_layout(self, topology: Topology) -> None: ...


OPTIONAL = ("prepare", "failed_after_exchange", "check_layout")
"""Members a command calls only where the recipe has them (checked then all the same)."""
TRAINER_MEMBERS = ("__init__", "step", "state_dict", "load_state_dict", "close")


def _declared(owner: type, name: str) -> inspect.Signature:
    """The protocol's signature of ``name`` without ``self``."""
    signature = inspect.signature(getattr(owner, name))
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def signature_problem(function: Any, declared: inspect.Signature) -> str | None:
    """Why ``function`` cannot be called as ``declared`` is (None: it can): each declared parameter taken as it is
    passed (by position or by keyword, a declared default kept a default), every other parameter optional."""
    try:
        own = inspect.signature(function)
    except (TypeError, ValueError):
        return None  # a builtin or C function: nothing to read
    params = list(own.parameters.values())
    kinds = {param.kind for param in params}
    positional = [param for param in params if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD)]
    by_name = {param.name: param for param in params if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)}
    used: set[str] = set()
    for index, wanted in enumerate(declared.parameters.values()):
        if wanted.kind is wanted.POSITIONAL_OR_KEYWORD:
            if index < len(positional) and positional[index].name == wanted.name:
                found = positional[index]
            elif index >= len(positional) and inspect.Parameter.VAR_POSITIONAL in kinds:
                continue
            else:
                return f"takes no {wanted.name} as parameter {index + 1}"
        else:
            found = by_name.get(wanted.name)
            if found is None:
                if inspect.Parameter.VAR_KEYWORD in kinds:
                    continue
                return f"takes no {wanted.name}= keyword"
        if wanted.default is not wanted.empty and found.default is found.empty:
            return f"needs {wanted.name}, which may be left out"
        used.add(found.name)
    extra = [param.name for param in params if param.name not in used and param.default is param.empty
             and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)]
    return f"needs {extra[0]}, which is never passed" if extra else None


def contract_problems(module: Any, needs: tuple[str, ...] = REQUIRED) -> list[str]:
    """How ``module`` falls short of :class:`Recipe` for a command that calls ``needs`` (empty: it does not): a
    needed member missing, or a member present (needed or optional) that cannot be called as the protocol says."""
    problems = [f"has no {name}()" for name in needs if not callable(getattr(module, name, None))]
    for name in dict.fromkeys((*needs, *OPTIONAL)):  # each once, needed or optional
        member = getattr(module, name, None)
        if member is None or not callable(member):
            continue
        if name == "Trainer":
            problems.extend(f"Trainer{problem}" for problem in _trainer_problems(member))
            continue
        problem = signature_problem(member, _declared(Recipe, name))
        if problem is not None:
            problems.append(f"{name}() {problem}")
    return problems


def _trainer_problems(trainer: type) -> list[str]:
    problems = [f" has no {name}()" for name in TRAINER_MEMBERS if not callable(getattr(trainer, name, None))]
    if getattr(trainer, "iteration", None) is None:
        problems.append(" has no iteration")
    for name in TRAINER_MEMBERS:
        if callable(getattr(trainer, name, None)):
            problem = signature_problem(getattr(trainer, name), inspect.signature(getattr(Trainer, name)))
            if problem is not None:
                problems.append(f".{name}() {problem}")
    return problems


def _is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def check_recipe_exists(spec: str) -> None:
    """That ``--recipe`` names a file or a module that exists, without importing it (cheap: run before a
    job says anything); what it provides is checked when it is loaded."""
    if _is_file_spec(spec):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ConfigError(RECIPE_FLAG, f"{spec} is not a file")
        if path.suffix != ".py":
            raise ConfigError(RECIPE_FLAG, f"{spec} is not a .py file")
        return
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ConfigError(RECIPE_FLAG, f"no module named {spec!r} (give an importable module or a .py file)")


def load_recipe(spec: str, *, needs: tuple[str, ...] = REQUIRED, command: str = "run") -> ModuleType:
    """The recipe module ``spec`` names, checked to provide ``needs``; ConfigError naming ``--recipe``."""
    if _is_file_spec(spec):
        module = _load_file(spec)
    else:
        try:
            module = importlib.import_module(spec)
        except ModuleNotFoundError as error:
            if error.name is not None and spec.startswith(error.name):
                raise ConfigError(RECIPE_FLAG, f"no module named {spec!r} (give an importable module or a .py file)") from None
            raise
    problems = contract_problems(module, needs)
    if problems:
        raise ConfigError(RECIPE_FLAG, f"{spec} {problems[0]}, which `mimo-pipes {command}` calls (see mimo_pipes.cli.job.recipe.Recipe)")
    return module


def _load_file(spec: str) -> ModuleType:
    check_recipe_exists(spec)
    path = Path(spec).expanduser().resolve()
    # One stable name per file, so every rank (and pickled objects of the recipe) resolve the same module.
    name = f"mimo_pipes_recipe_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, path)
    assert loader_spec is not None and loader_spec.loader is not None
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception:
        del sys.modules[name]
        raise
    return module
