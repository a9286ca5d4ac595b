"""The pipeline's layout from megatron-core's ``module_to_grid_map``: the grids a ``MimoModel`` is built with.

``MimoModelConfig.module_to_grid_map`` holds one ``HyperCommGrid`` per module (``"language"`` and each
modality), each with ``shape``, ``dim_names`` (fastest varying first) and ``rank_offset``. The same map gives
the pipeline its :class:`~mimo_pipes.parallel.topology.Topology` (each module's TP/CP/PP/DP and offset),
the ``--component`` specs a :class:`~mimo_pipes.config.PipelineConfig` takes, and this rank's
:class:`~mimo_pipes.exchange.RankLayout`, so the layout is said once. Grids on disjoint ranks are the
non-colocated layout; grids that all span the same ranks are colocated (every rank holds every module's
fields). A map the pipeline cannot serve raises :class:`GridMapError`, one line naming the module.

Only the grids' attributes are read (no process group is made here): a grid built with ``WORLD_SIZE`` set
and no torch.distributed serves as well as a live one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from mimo_pipes.config.counts import as_count
from mimo_pipes.config.flags import flag
from mimo_pipes.errors import ConfigError
from mimo_pipes.exchange.context import RankLayout
from mimo_pipes.exchange.process_groups import build_rank_groups
from mimo_pipes.parallel.pairing import pairing_problem
from mimo_pipes.parallel.topology import DEFAULT_ORDER, LANGUAGE_MODULE, ModuleSpec, Topology, build_topology, canonical_slot_count

GRID_MAP = "module_to_grid_map"
# The dimensions a module's grid may name, fastest varying first as the pipeline lays ranks out (ep: expert
# parallelism, which megatron-core lays out in a registered view, not in the base grid: size 1 here).
PLACEMENT = ("tp", "cp", "ep", "pp", "dp")


class GridMapError(ConfigError):
    """A ``module_to_grid_map`` the pipeline cannot serve; the message names the module."""

    def __init__(self, message: str) -> None:
        super().__init__(GRID_MAP, message.removeprefix(f"{GRID_MAP}: "))


@dataclass(frozen=True)
class GridLayout:
    """What the grids say: the topology, whether the modules share their ranks, and the specs written out."""

    topology: Topology
    colocated: bool

    @property
    def components(self) -> tuple[str, ...]:
        """The ``--component`` specs of the topology (``PipelineConfig.components``)."""
        return tuple(module.spec for module in self.topology.modules)

    def module_of(self, global_rank: int) -> str | None:
        """The module whose fields ``global_rank``'s micro-batches carry (None: every field, colocated)."""
        return None if self.colocated else self.topology.position(global_rank).module.name


def module_spec(name: str, grid: Any) -> ModuleSpec:
    """One module's spec from its grid; GridMapError naming the module when the pipeline cannot lay it out."""
    try:
        shape, dims, offset = [int(size) for size in grid.shape], [str(dim) for dim in grid.dim_names], int(grid.rank_offset)
    except (AttributeError, TypeError, ValueError):
        raise GridMapError(f"{name}: {type(grid).__name__} is not a HyperCommGrid (needs shape, dim_names, rank_offset)") from None
    if len(shape) != len(dims) or len(set(dims)) != len(dims):
        raise GridMapError(f"{name}: shape {shape} does not match dim_names {dims} one size per distinct name")
    unknown = [dim for dim in dims if dim not in PLACEMENT]
    if unknown:
        raise GridMapError(f"{name}: dimension {unknown[0]!r} is not one of {', '.join(PLACEMENT)}")
    if "dp" not in dims:
        raise GridMapError(f"{name}: the grid has no 'dp' dimension (megatron-core's MimoModel reads each module's DP size from it)")
    sizes = dict(zip(dims, shape))
    if min(shape, default=1) < 1:
        raise GridMapError(f"{name}: every size must be >= 1, got shape {shape}")
    if sizes.get("ep", 1) > 1:
        raise GridMapError(f"{name}: ep={sizes['ep']} in the base grid; expert parallelism belongs in a registered view")
    return ModuleSpec(name, tp=sizes.get("tp", 1), cp=sizes.get("cp", 1), pp=sizes.get("pp", 1), dp=sizes["dp"], rank_offset=offset,
                      order=placement_order(dims, sizes))


def placement_order(dims: list[str], sizes: dict[str, int]) -> str:
    """The module's placement order (fastest first) as a grid of these ``dim_names`` places its ranks: only the
    dimensions of size > 1 decide it, so an order equivalent to the pipeline's default is written as the default."""
    default = DEFAULT_ORDER.split("-")
    placed = [dim for dim in dims if sizes[dim] > 1 and dim in default]
    if placed == [dim for dim in default if dim in placed]:
        return DEFAULT_ORDER
    return "-".join(placed + [dim for dim in default if dim not in placed])


def grid_layout(module_to_grid_map: Mapping[str, Any], *, micro_batch_size: int | None = None) -> GridLayout:
    """The pipeline's layout from megatron-core's grid map (see the module doc). ``micro_batch_size`` (the
    global micro-batch) is checked against the canonical grid when given. Raises GridMapError."""
    if not isinstance(module_to_grid_map, Mapping) or not module_to_grid_map:
        raise GridMapError(f"needs one HyperCommGrid per module, got {module_to_grid_map!r}")
    if LANGUAGE_MODULE not in module_to_grid_map:
        raise GridMapError(f"no {LANGUAGE_MODULE!r} grid (megatron-core's fixed key of the language model); got {', '.join(map(str, module_to_grid_map))}")
    specs = [module_spec(str(name), grid) for name, grid in module_to_grid_map.items()]
    language = next(spec for spec in specs if spec.is_language)
    spans = {(spec.rank_offset, spec.size) for spec in specs}
    colocated = len(spans) == 1
    if colocated:
        topology = _colocated(specs, language)
    else:
        topology = _non_colocated(specs, language)
    if micro_batch_size is not None:
        micro_batch_size = as_count(micro_batch_size, flag("micro_batch_size"), minimum=1)
        slots = canonical_slot_count(spec.dp for spec in specs)
        if micro_batch_size % slots:
            sizes = ", ".join(f"{spec.name} dp={spec.dp}" for spec in specs)
            raise GridMapError(f"the global micro-batch size {micro_batch_size} is not a multiple of {slots}, the lcm of the DP sizes ({sizes})")
    return GridLayout(topology, colocated)


def rank_layout(
    module_to_grid_map: Mapping[str, Any],
    *,
    micro_batch_size: int | None = None,
    exchange_backend: str = "gloo",
    exchange_device: torch.device | None = None,
    agreement_group: Any = None,  # a torch.distributed ProcessGroup
) -> RankLayout | None:
    """This rank's :class:`~mimo_pipes.exchange.RankLayout` from the grid map: its module's DP rank and size, the
    canonical grid, the pipeline's own exchange group (made here: a collective over the whole world, every rank
    calls it in the same order) and the fields its micro-batches carry. None on a rank no grid holds."""
    layout = grid_layout(module_to_grid_map, micro_batch_size=micro_batch_size)
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise RuntimeError("rank_layout: torch.distributed is not initialised: it makes the pipeline's exchange groups, a collective "
                           "every rank calls after init_process_group (grid_layout reads the grids without one)")
    groups = build_rank_groups(layout.topology, exchange_backend=exchange_backend)
    if groups is None:
        return None
    own = groups.layout(exchange_device, agreement_group)
    return replace(own, module=layout.module_of(groups.position.global_rank))


def _colocated(specs: list[ModuleSpec], language: ModuleSpec) -> Topology:
    """Every module on the same ranks: one module holding every field, laid out as the language grid."""
    for spec in specs:
        if spec.dp != language.dp:
            raise GridMapError(
                f"{spec.name} dp={spec.dp} on the language model's ranks (dp={language.dp}): colocated modules of different DP "
                "sizes are served by megatron-core's colocated bridge, which assumes as many image tokens in every sample"
            )
    return _tiled([language])


def _non_colocated(specs: list[ModuleSpec], language: ModuleSpec) -> Topology:
    ordered = sorted(specs, key=lambda spec: spec.rank_offset)
    for before, after in zip(ordered, ordered[1:]):
        if after.rank_offset < before.rank_offset + before.size:
            raise GridMapError(
                f"{after.name} ranks {after.rank_offset}-{after.rank_offset + after.size - 1} overlap {before.name} ranks "
                f"{before.rank_offset}-{before.rank_offset + before.size - 1}: modules share either all their ranks (colocated) or none"
            )
    for spec in specs:
        if spec.cp > 1:
            raise GridMapError(f"{spec.name} cp={spec.cp}: megatron-core's BridgeCommunicator moves no context-parallel activations (cp must be 1)")
        problem = None if spec.is_language else pairing_problem(spec, language)
        if problem is not None:
            raise GridMapError(problem)
    return _tiled(ordered)


def _tiled(specs: list[ModuleSpec]) -> Topology:
    try:
        return build_topology(specs)
    except ConfigError as error:
        raise GridMapError(str(error).removeprefix(f"{error.setting}: ")) from None
