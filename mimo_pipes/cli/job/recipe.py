"""What a recipe module provides, and how ``--recipe`` names one.

A recipe builds one module rank's graph. ``mimo-pipes run``, ``analyze`` and ``train`` call it:

* ``prepare(config, log)`` (optional): once, before any rank starts: check the user's paths, build what
  every rank then only loads (the embedded data and processor). Raises ConfigError naming the flag.
* ``build(config, layout, *, consumed_microbatches=0)``: on every rank, its loader (a GraphLoader).
* ``row_counts(config, *, real_tokens, runs, progress)``: for ``analyze``, every dataset row's counts as
  ``build``'s graph would make them (a :class:`~mimo_pipes.analysis.row_counts.RowCounts`);
  ``progress(description, total)`` gives the callback that takes the rows done. With
  ``config.skip_bad_samples`` the rows ``build``'s graph would replace are listed in ``bad_rows`` (row ->
  why) instead of raised, found as the graph finds them under ``config.exchange_payload``.
* ``failed_after_exchange(config, rows, progress)`` (optional, for ``analyze`` under ``--exchange-payload
  rows`` with ``--skip-bad-samples``): which of the dataset ``rows`` consumed would be counted and moved, then
  fail where they are processed (row -> why): the rows the run masks. Without it analyze cannot say.
* ``Trainer`` (training recipes): ``Trainer(config, options, groups, topology, loader)`` with ``step()``,
  ``iteration``, ``state_dict()`` / ``load_state_dict()`` and ``close()``; optionally ``check_layout(topology)``.

``--recipe`` takes an importable module name (``mimo_pipes_recipes.vlm_sft``) or the path of a ``.py``
file; every rank loads it the same way.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from mimo_pipes.errors import ConfigError

RECIPE_FLAG = "--recipe"
DEFAULT_RECIPE = "mimo_pipes_recipes.vlm_sft"
TRAINING_RECIPE = "mimo_pipes_recipes.tiny_mimo_train"
REQUIRED = ("build",)


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
    missing = [name for name in needs if not callable(getattr(module, name, None))]
    if missing:
        raise ConfigError(RECIPE_FLAG, f"{spec} has no {', '.join(missing)}(), which `mimo-pipes {command}` calls (see mimo_pipes.cli.job.recipe)")
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
