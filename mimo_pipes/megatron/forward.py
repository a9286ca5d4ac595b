"""What a given ``MimoModel.forward`` can take: megatron-core's releases differ, so a batch is fitted to the
installed release instead of guessed.

One rule decides both M-RoPE positions (``position_ids`` ``[3, B, S]``) and packed micro-batches
(``packing_kwargs``): ``MimoModel`` takes them from megatron-core :data:`MROPE_AND_PACKING` (0.18) on, whose
``forward`` has ``packing_kwargs``. megatron-core 0.18 needs Python 3.12 or later; on Python 3.11 the newest
release is 0.16.1, whose ``MimoModel`` takes neither (its text embedding indexes the positions as ``[B, S]``).
:func:`forward_support` applies the rule, :func:`fit_to_forward` holds every batch to it, and the recipes call
:func:`require_mrope_and_packing` before they build anything. megatron-core is imported only when these
functions look at the installed release.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

MROPE_AND_PACKING = (0, 18)
"""The first megatron-core release whose ``MimoModel`` takes M-RoPE positions and packed micro-batches."""
PACKING_KEY = "packing_kwargs"


def mimo_forward() -> Callable[..., Any]:
    """The installed megatron-core's ``MimoModel.forward`` (ImportError when megatron-core or its MIMO
    model is absent). megatron-core's import-time warnings (no TransformerEngine, an experimental config) are
    held back: a check of the release should print one line or none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.models.mimo import MimoModel

    return MimoModel.forward


@lru_cache(maxsize=1)
def installed_version() -> str | None:
    """The installed megatron-core's version (None when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-core")
    except PackageNotFoundError:
        return None


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as ``0.19.2`` or ``0.18.0rc1``."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in (parts[1] if len(parts) > 1 else "0") if ch.isdigit()) or 0)
    except ValueError:
        raise ValueError(f"megatron-core version {version!r} is not of the form MAJOR.MINOR[.PATCH]") from None


@lru_cache(maxsize=64)
def forward_parameters(forward: Callable[..., Any]) -> tuple[str, ...]:
    """The keyword parameters of ``forward`` (``self`` left out)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(name for name, p in inspect.signature(forward).parameters.items() if p.kind in kinds and name != "self")


@dataclass(frozen=True)
class ForwardSupport:
    """A ``MimoModel.forward`` and the megatron-core release it comes from.

    ``mrope_and_packing``: it takes M-RoPE positions ``[3, B, S]`` and ``packing_kwargs`` (both or neither:
    the release is :data:`MROPE_AND_PACKING` or later and the signature has ``packing_kwargs``). Pass
    ``mrope=support.mrope_and_packing`` to :func:`~mimo_pipes.megatron.batch.mimo_batch`."""

    version: str
    parameters: tuple[str, ...]

    @property
    def mrope_and_packing(self) -> bool:
        return release(self.version) >= MROPE_AND_PACKING and PACKING_KEY in self.parameters

    def why_not(self) -> str:
        """Why this forward takes neither M-RoPE positions nor packed micro-batches, in words."""
        floor = ".".join(map(str, MROPE_AND_PACKING))
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        reason = (f"megatron-core {self.version}'s MimoModel.forward takes no {PACKING_KEY}" if release(self.version) >= MROPE_AND_PACKING
                  else f"this is megatron-core {self.version}")
        return (f"M-RoPE positions [3, B, S] and packed micro-batches need megatron-core >= {floor}, whose MimoModel.forward "
                f"takes {PACKING_KEY} (and which needs Python >= 3.12; this is Python {python}); {reason}")


def forward_support(forward: Callable[..., Any] | None = None, *, version: str | None = None) -> ForwardSupport:
    """The rule for ``forward`` (default: the installed ``MimoModel.forward``) of megatron-core ``version``
    (default: the installed one). ImportError when megatron-core is needed and absent."""
    version = version if version is not None else installed_version()
    if version is None:
        raise ImportError("megatron-core is not installed: pip install megatron-core (see docs/megatron.md for the release your Python takes)")
    return ForwardSupport(version, forward_parameters(forward if forward is not None else mimo_forward()))


def fit_to_forward(kwargs: Mapping[str, Any], forward: Callable[..., Any] | None = None, *, version: str | None = None) -> dict[str, Any]:
    """``kwargs`` (of :func:`~mimo_pipes.megatron.batch.mimo_batch`) for ``forward`` (default: the installed
    ``MimoModel.forward``) of megatron-core ``version`` (default: the installed one): keys it lacks are
    dropped where their value is None. ValueError, in one line, for what it cannot take: M-RoPE positions
    ``[3, B, S]`` or a packed micro-batch below the rule of :class:`ForwardSupport` (pass ``mrope=False`` to
    ``mimo_batch`` there), or any other key it lacks that has a value."""
    support = forward_support(forward, version=version)
    positions = kwargs.get("position_ids")
    needs = [key for key, needed in (("position_ids", getattr(positions, "ndim", 2) == 3),
                                     (PACKING_KEY, kwargs.get(PACKING_KEY) is not None)) if needed]
    if needs and not support.mrope_and_packing:
        shown = "M-RoPE position_ids [3, B, S]" if needs[0] == "position_ids" else "packing_kwargs (a packed micro-batch)"
        raise ValueError(f"fit_to_forward: this MimoModel.forward cannot take {shown}: {support.why_not()}; "
                         "pass mrope=False to mimo_batch for [B, S] positions, and do not pack")
    refused = [key for key, value in kwargs.items() if key not in support.parameters and value is not None]
    if refused:
        raise ValueError(f"fit_to_forward: this MimoModel.forward takes no {', '.join(refused)} (it takes {', '.join(support.parameters)})")
    return {key: value for key, value in kwargs.items() if key in support.parameters}


def require_mrope_and_packing(program: str, forward: Callable[..., Any] | None = None, *, version: str | None = None) -> ForwardSupport:
    """For a program that feeds M-RoPE positions (or packed micro-batches) to ``MimoModel``: call it before
    building anything. SystemExit with one line naming ``program`` when megatron-core is absent or below the
    rule of :class:`ForwardSupport` (:class:`ProgramRefused`: status 2)."""
    try:
        support = forward_support(forward, version=version)
    except ImportError as error:
        raise ProgramRefused(f"{program}: needs megatron-core's MimoModel: {error}") from None
    if not support.mrope_and_packing:
        raise ProgramRefused(f"{program}: {support.why_not()}")
    return support


class ProgramRefused(SystemExit):
    """A program's refusal of its setting or machine: its one line on stderr (said when raised) and exit status 2, as
    every mimo-pipes command and recipe ends on a bad configuration (a SystemExit of a string would exit 1)."""

    def __init__(self, message: str) -> None:
        print(message, file=sys.stderr)
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message
