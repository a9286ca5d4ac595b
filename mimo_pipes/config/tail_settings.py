"""The settings of a graph's tail (costs, windows, exchange, assembly, packing), resolved once.

Every entry point (the recipes, ``balance_iterator``, the DataLoader adapter, ``mimo-pipes analyze``)
resolves its reordering settings here: :func:`resolve_plan` into the :class:`BalancePlan` every module
of a run shares (integer weights, the loaded time model, the planner's floor and two-level grouping,
window), and :func:`resolve_tail` into one rank's frozen :class:`TailSettings` (the plan plus B/d,
collation, the module's fields and where rows are processed), which the tail's nodes take by keyword. Nothing
else derives them. Where a run starts is not a setting: the loader alone takes it (``GraphLoader``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mimo_pipes.balance.settings import PlannerSettings
from mimo_pipes.config import PipelineConfig, ReorderConfig, check_exchange_payload, check_pack_pad_multiple, flag
from mimo_pipes.config.counts import as_count
from mimo_pipes.config.pipeline import reorder_window_size
from mimo_pipes.config.planner import planner_settings
from mimo_pipes.config.workers import processing_workers
from mimo_pipes.errors import ConfigError
from mimo_pipes.parallel.topology import Topology, build_topology, component_setting
from mimo_pipes.samples.collate import Collator, FieldSpec
from mimo_pipes.samples.cost import CostFunction
from mimo_pipes.samples.cost_range import check_cost_range
from mimo_pipes.samples.module_fields import ModuleFields, module_fields
from mimo_pipes.time_model.model import TimeModel

ROWS, SAMPLES = "rows", "samples"
PROCESSING_METHODS = ("thread", "process")

LOAD = object()
"""``time_model=LOAD``: load the file ``reorder_cost_model`` names (read once per process)."""


@dataclass(frozen=True)
class BalancePlan:
    """How every module of a run prices samples and plans windows: the same on every rank of every module.

    ``window_size`` is W (1 without reordering); ``planner`` the per-forward floor in cost units and the
    two-level grouping (zeros without reordering)."""

    cost: CostFunction
    window_size: int
    reorder: bool = False
    overlap: bool = True
    across_microbatches: bool = False
    planner: PlannerSettings = PlannerSettings()

    @property
    def time_model(self) -> TimeModel | None:
        return self.cost.time_model


@dataclass(frozen=True)
class Processing:
    """Where a rank's rows become samples. ``payload`` ``samples``: before the tail (the exchange moves
    processed samples); ``rows``: after the exchange, on the rank that trains on them (RowProcessor), on
    ``workers`` threads or worker processes (``method``). ``mask_failed`` (``--skip-bad-samples`` under
    ``rows``): a row that fails there is masked on every module (:mod:`mimo_pipes.samples.masking`) instead
    of stopping the run."""

    payload: str = SAMPLES
    workers: int = 1
    method: str = "thread"
    mask_failed: bool = False

    @property
    def rows(self) -> bool:
        return self.payload == ROWS


@dataclass(frozen=True)
class TailSettings:
    """What the tail's nodes of one module rank need: the run's :class:`BalancePlan`, the global micro-batch
    size B and this module's B/d, the placeholder ids the cost counts, collation, sequence packing, the fields
    the module's micro-batches carry and where its rows are processed."""

    plan: BalancePlan
    micro_batch_size: int
    samples_per_rank: int
    image_token_ids: tuple[int, ...]
    collator: Collator
    pack_sequences: bool = False
    pack_pad_multiple: int = 1
    fields: ModuleFields = ModuleFields()
    processing: Processing = Processing()


def resolve_plan(reorder: ReorderConfig, topology: Topology | None, time_model: TimeModel | None | object = LOAD) -> BalancePlan:
    """The run's plan from its reordering settings; raises ConfigError naming the flag on a bad setting.

    ``topology`` (every module's layout) decides the planner's floor and two-level grouping: it is needed
    when reordering with a time model or with two-level balance."""
    reorder.validate()
    model = reorder.load_time_model() if time_model is LOAD else time_model
    assert model is None or isinstance(model, TimeModel)
    encoder_weight, language_weight = reorder.integer_cost_weights()
    cost = CostFunction(encoder_weight, language_weight, reorder.integer_language_square_weight(), model)
    planner = PlannerSettings()
    if reorder.intra_microbatch_reorder:
        if topology is None and (model is not None or reorder.reorder_two_level):
            setting = flag("reorder_two_level") if reorder.reorder_two_level else flag("reorder_cost_model")
            raise ConfigError(
                component_setting(),
                f"{setting} plans with every module's layout (the floor of a forward, the encoder replicas): pass the component specs",
            )
        if topology is not None:
            planner = planner_settings(topology, reorder, model)
    return BalancePlan(
        cost=cost,
        window_size=reorder_window_size(reorder),
        reorder=reorder.intra_microbatch_reorder,
        overlap=reorder.overlap_intra_microbatch_reorder,
        across_microbatches=reorder.reorder_across_microbatches,
        planner=planner,
    )


def resolve_tail(
    reorder: ReorderConfig,
    *,
    micro_batch_size: int,
    dp_size: int,
    grid_size: int,
    image_token_ids: int | Sequence[int],
    pad_length: int | None,
    pad_values: Mapping[str, int | float],
    vision_fields: Mapping[str, FieldSpec] | None = None,
    topology: Topology | None = None,
    pack_sequences: bool = False,
    pack_pad_multiple: int = 1,
    time_model: TimeModel | None | object = LOAD,
    module: str | None = None,
    payload: str = SAMPLES,
    workers: int | None = 1,
    method: str = "thread",
    mask_failed: bool = False,
) -> TailSettings:
    """One module rank's tail settings (see :func:`resolve_plan` for ``topology`` and ``time_model``).

    ``pad_length`` None pads each micro-batch to its longest sample. ``module``: the module's name, which
    decides the fields its micro-batches carry (:mod:`mimo_pipes.samples.module_fields`; None: all of them).
    ``payload``, ``workers`` (None: the cores this rank may use, :mod:`mimo_pipes.config.workers`), ``method``,
    ``mask_failed``: see :class:`Processing`. Raises ConfigError naming the flag."""
    # Counts as plain ints (numpy and torch integers too: they end up in states, which hold plain values only).
    micro_batch_size = as_count(micro_batch_size, flag("micro_batch_size"), minimum=1)
    dp_size, grid_size = as_count(dp_size, "dp_size", minimum=1), as_count(grid_size, "grid_size", minimum=1)
    if pad_length is not None:
        pad_length = as_count(pad_length, flag("seq_length"), minimum=1)
    pack_pad_multiple = check_pack_pad_multiple(pack_pad_multiple)
    workers = processing_workers(None if workers is None else as_count(workers, flag("num_workers")))
    if micro_batch_size % grid_size or grid_size % dp_size:
        raise ConfigError(
            flag("micro_batch_size"),
            f"{micro_batch_size} must be a multiple of the canonical grid size {grid_size}, which must be a multiple of dp size {dp_size}",
        )
    if topology is not None and topology.grid_size != grid_size:
        raise ValueError(f"grid_size {grid_size} is not the topology's canonical grid {topology.grid_size}")
    reorder.check_padding(pad_length is not None)
    plan = resolve_plan(reorder, topology, time_model)
    if pad_length is not None:  # every sample fits --seq-length: its cost is bounded before anything runs
        check_cost_range(plan.cost.weights, plan.time_model, max_tokens=pad_length, micro_batch_size=micro_batch_size,
                         window_microbatches=plan.window_size, floor=plan.planner.floor)
    several = isinstance(image_token_ids, (list, tuple, range, np.ndarray, torch.Tensor)) and np.ndim(image_token_ids) > 0
    ids = tuple(as_count(i, "image_token_id") for i in (image_token_ids if several else (image_token_ids,)))
    if not ids:
        raise ValueError("image_token_ids must name at least one placeholder id")
    check_exchange_payload(payload)
    if method not in PROCESSING_METHODS:
        raise ValueError(f"method must be one of {', '.join(PROCESSING_METHODS)}, got {method!r}")
    fields = module_fields(module)
    carried = {name: spec for name, spec in (vision_fields or {}).items() if fields.carries(name)}
    return TailSettings(
        plan=plan,
        micro_batch_size=micro_batch_size,
        samples_per_rank=micro_batch_size // dp_size,
        image_token_ids=ids,
        collator=Collator(pad_length, dict(pad_values), carried),
        pack_sequences=pack_sequences,
        pack_pad_multiple=pack_pad_multiple,
        fields=fields,
        processing=Processing(payload, workers, method, mask_failed=mask_failed and payload == ROWS),
    )


def resolve_pipeline_tail(
    config: PipelineConfig,
    dp_size: int,
    *,
    image_token_ids: int | Sequence[int],
    pad_values: Mapping[str, int | float],
    vision_fields: Mapping[str, FieldSpec] | None = None,
    time_model: TimeModel | None | object = LOAD,
    module: str | None = None,
    method: str = "thread",
    payload: str | None = None,
) -> TailSettings:
    """:func:`resolve_tail` for a recipe's :class:`PipelineConfig`: the topology, pad length, packing,
    processing workers and (unless ``payload`` is given) the payload come from the config."""
    topology = build_topology(config.components)
    return resolve_tail(
        config.reorder,
        micro_batch_size=config.micro_batch_size,
        dp_size=dp_size,
        grid_size=topology.grid_size,
        image_token_ids=image_token_ids,
        pad_length=config.seq_length if config.pad_to_seq_length else None,
        pad_values=pad_values,
        vision_fields=vision_fields,
        topology=topology,
        pack_sequences=config.pack_sequences_in_batch,
        pack_pad_multiple=config.pack_pad_multiple,
        time_model=time_model,
        module=module,
        payload=config.exchange_payload if payload is None else payload,
        workers=config.num_workers,
        method=method,
        mask_failed=config.skip_bad_samples,
    )
