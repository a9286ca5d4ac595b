"""Module specs, the canonical grid and rank placement: plain arithmetic, no torch.distributed.

A module is a rank group with its own parallelism, written as ``name=tp=1,cp=1,pp=1,dp=2,rank_offset=0``.
Inside a module ranks are laid out as megatron-core's HyperCommGrid lays them out for the dimension
order ``tp, cp, ep, pp, dp`` (tp varies fastest), which is how Megatron MIMO builds one grid per module;
``order=tp-cp-dp-pp`` (or any order of tp, cp, pp, dp, fastest first) lays them out in another order, as a
grid with those ``dim_names`` does (megatron-core's default order puts dp inside pp).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import reduce

from mimo_pipes.errors import ConfigError, setting_name

LANGUAGE_MODULE = "language"
COMPONENT_FLAG = "--component"


def component_setting() -> str:
    """How an error names the module specs: ``components`` (the field) in Python, ``--component`` in a command."""
    return setting_name("components", COMPONENT_FLAG)


SPEC_KEYS = ("tp", "cp", "pp", "dp", "etp", "rank_offset")
ORDER_KEY = "order"
DEFAULT_ORDER = "tp-cp-pp-dp"  # the placement dimensions, fastest first
# Order of the grid dimensions, fastest varying first (megatron-core's dim_names for a MIMO module).
GRID_DIMS = ("tp", "cp", "ep", "pp", "dp")


@dataclass(frozen=True)
class ModuleSpec:
    """One module's parallel layout and where its ranks start in the world."""

    name: str
    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    etp: int = 1
    rank_offset: int = 0
    order: str = DEFAULT_ORDER  # how the module's ranks are placed, fastest dimension first

    def __post_init__(self) -> None:
        if sorted(self.order.split("-")) != sorted(DEFAULT_ORDER.split("-")):
            raise ConfigError(component_setting(), f"{self.name}: order={self.order!r} must list tp, cp, pp and dp once each, fastest first")
        # Expert tensor parallelism re-splits ranks that tp/cp/dp already place: it adds none to the grid,
        # and scalable data parallelism does not support it (checked here, before any rank arithmetic).
        if self.etp != 1:
            raise ConfigError(
                component_setting(), f"{self.name}: etp={self.etp}: expert tensor parallelism > 1 is not supported"
            )

    @property
    def size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def ranks(self) -> range:
        return range(self.rank_offset, self.rank_offset + self.size)

    @property
    def is_language(self) -> bool:
        return self.name == LANGUAGE_MODULE

    @property
    def grid_shape(self) -> list[int]:
        return [self.tp, self.cp, self.etp, self.pp, self.dp]

    @property
    def spec(self) -> str:
        """The spec with every key written out: one string per meaning (``language=dp=2`` and
        ``language=tp=1,pp=1,dp=2,rank_offset=0`` are one layout)."""
        order = "" if self.order == DEFAULT_ORDER else f",{ORDER_KEY}={self.order}"
        return f"{self.name}=" + ",".join(f"{key}={getattr(self, key)}" for key in SPEC_KEYS) + order

    @property
    def dp_stride(self) -> int:
        """Global-rank distance between consecutive DP ranks of one DP group."""
        dims = self.order.split("-")
        return math.prod(getattr(self, dim) for dim in dims[: dims.index("dp")])

    def coordinates(self, local_rank: int) -> dict[str, int]:
        """A rank's coordinate on each placement dimension, from its rank inside the module."""
        out = {}
        for dim in self.order.split("-"):
            size = getattr(self, dim)
            out[dim], local_rank = local_rank % size, local_rank // size
        return out


@dataclass(frozen=True)
class RankPosition:
    """Where one global rank sits: its module and coordinates in that module's grid."""

    module: ModuleSpec
    global_rank: int
    tp_rank: int
    cp_rank: int
    pp_rank: int
    dp_rank: int

    @property
    def dp_size(self) -> int:
        return self.module.dp


def parse_component(spec: str) -> ModuleSpec:
    """Parse ``name=key=value,...``; missing keys default to 1 (offset 0). Errors name ``--component``."""
    name, sep, body = spec.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(component_setting(), f"{spec!r} must look like 'language=tp=1,pp=1,dp=2,rank_offset=0'")
    values: dict[str, int | str] = {}
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or key not in (*SPEC_KEYS, ORDER_KEY):
            raise ConfigError(component_setting(), f"{spec!r}: unknown entry {item!r}; keys are {', '.join((*SPEC_KEYS, ORDER_KEY))}")
        if key in values:
            raise ConfigError(component_setting(), f"{spec!r}: {key} given twice")
        if key == ORDER_KEY:
            values[key] = raw.strip()
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(component_setting(), f"{spec!r}: {key}={raw!r} is not an integer") from None
        minimum = 0 if key == "rank_offset" else 1
        if value < minimum:
            raise ConfigError(component_setting(), f"{spec!r}: {key} must be >= {minimum}, got {value}")
        values[key] = value
    return ModuleSpec(name=name, **values)  # type: ignore[arg-type]


def canonical_slot_count(dp_sizes: Iterable[int]) -> int:
    """G = lcm of the modules' DP sizes: the finest split every module's DP ranks agree on."""
    return reduce(math.lcm, dp_sizes, 1)


def owned_slots(dp_rank: int, dp_size: int, grid_size: int) -> range:
    """Slots [r*G/d, (r+1)*G/d) belong to DP rank r of a module with DP size d."""
    if grid_size % dp_size:
        raise ValueError(f"dp size {dp_size} does not divide the canonical grid {grid_size}")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp rank {dp_rank} outside [0, {dp_size})")
    per_rank = grid_size // dp_size
    return range(dp_rank * per_rank, (dp_rank + 1) * per_rank)


def owned_positions(dp_rank: int, dp_size: int, micro_batch_size: int) -> range:
    """Positions of a global micro-batch (canonical order) that DP rank r holds: B/d contiguous ones."""
    if micro_batch_size % dp_size:
        raise ValueError(f"micro-batch size {micro_batch_size} is not divisible by dp size {dp_size}")
    per_rank = micro_batch_size // dp_size
    return range(dp_rank * per_rank, (dp_rank + 1) * per_rank)


def fanout_targets(encoder_dp_rank: int, encoder_dp: int, language_dp: int) -> range:
    """Language DP replicas fed by one encoder replica: [i*k, (i+1)*k) with k = d_lang / d_enc."""
    if language_dp % encoder_dp:
        raise ValueError(f"language dp {language_dp} is not a multiple of encoder dp {encoder_dp}")
    k = language_dp // encoder_dp
    return range(encoder_dp_rank * k, (encoder_dp_rank + 1) * k)


@dataclass(frozen=True)
class Topology:
    """All modules of a run; they tile the world ``0 .. world_size-1`` exactly."""

    modules: tuple[ModuleSpec, ...]

    @property
    def world_size(self) -> int:
        return sum(module.size for module in self.modules)

    @property
    def grid_size(self) -> int:
        return canonical_slot_count(module.dp for module in self.modules)

    @property
    def language(self) -> ModuleSpec:
        return next(module for module in self.modules if module.is_language)

    @property
    def encoders(self) -> tuple[ModuleSpec, ...]:
        return tuple(module for module in self.modules if not module.is_language)

    def module(self, name: str) -> ModuleSpec:
        for module in self.modules:
            if module.name == name:
                return module
        raise KeyError(name)

    def position(self, global_rank: int) -> RankPosition:
        for module in self.modules:
            if global_rank in module.ranks:
                at = module.coordinates(global_rank - module.rank_offset)
                return RankPosition(module, global_rank, at["tp"], at["cp"], at["pp"], at["dp"])
        raise ValueError(f"rank {global_rank} belongs to no module (world size {self.world_size})")

    def dp_groups(self, module: ModuleSpec) -> list[list[int]]:
        """Every DP group of ``module`` (global ranks by DP rank), ordered by their first rank: the groups
        megatron-core's HyperCommGrid enumerates for ``dp``."""
        return [self.dp_group_ranks(rank) for rank in module.ranks if self.position(rank).dp_rank == 0]

    def dp_group_ranks(self, global_rank: int) -> list[int]:
        """Global ranks of ``global_rank``'s DP group, ordered by DP rank."""
        position = self.position(global_rank)
        stride = position.module.dp_stride
        first = global_rank - position.dp_rank * stride
        return [first + dp_rank * stride for dp_rank in range(position.module.dp)]


def build_topology(specs: Sequence[str | ModuleSpec], world_size: int | None = None) -> Topology:
    """Parse and check module specs: unique names, a language module, exact tiling of the world."""
    modules = tuple(spec if isinstance(spec, ModuleSpec) else parse_component(spec) for spec in specs)
    if not modules:
        raise ConfigError(component_setting(), "at least one module is needed")
    names = [module.name for module in modules]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise ConfigError(component_setting(), f"module name given twice: {', '.join(duplicated)}")
    if LANGUAGE_MODULE not in names:
        raise ConfigError(component_setting(), f"no module named {LANGUAGE_MODULE!r}; got {', '.join(names)}")
    owners: dict[int, list[str]] = {}
    for module in modules:
        for rank in module.ranks:
            owners.setdefault(rank, []).append(module.name)
    doubled = {rank: who for rank, who in sorted(owners.items()) if len(who) > 1}
    if doubled:
        rank, who = next(iter(doubled.items()))
        raise ConfigError(component_setting(), f"rank {rank} is claimed by more than one module ({', '.join(who)}); check rank_offset")
    expected = world_size if world_size is not None else max(owners) + 1
    missing = [rank for rank in range(expected) if rank not in owners]
    if missing:
        raise ConfigError(
            component_setting(), f"rank {missing[0]} belongs to no module; modules must tile ranks 0..{expected - 1} with no gap"
        )
    beyond = [rank for rank in owners if rank >= expected]
    if beyond:
        raise ConfigError(component_setting(), f"rank {beyond[0]} is outside the world of {expected} ranks")
    return Topology(modules)
