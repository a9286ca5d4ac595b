"""Configuration dataclasses and the checks that run before any data is read.

Field names follow the run flags (``reorder_window_size`` is ``--reorder-window-size``), so a trainer's
config can embed :class:`ReorderConfig` and every error names the flag a user would type.
"""

from __future__ import annotations

import glob
import logging
import math
import os
from dataclasses import dataclass, field
from fractions import Fraction

from mimo_pipes.errors import ConfigError
from mimo_pipes.topology import COMPONENT_FLAG, Topology, build_topology

DATALOADER_TYPES = ("single", "cyclic")
EXCHANGE_TRANSPORTS = ("auto", "gloo", "nccl")
DEFAULT_COMPONENTS = ("language=tp=1,pp=1,dp=2,rank_offset=0", "images=tp=1,dp=2,rank_offset=2")


def resolve_exchange_transport(requested: str, world_backend: str, overlap: bool, device_max_connections: str | None) -> str:
    """The backend of the exchange group: ``gloo`` (CPU bytes) or ``nccl`` (bytes staged through the GPU).

    ``auto`` takes NCCL only for an exchange on the training thread of an NCCL run; an overlapped exchange
    goes over Gloo, which cannot contend with the trainer's NCCL kernels (an overlapped NCCL exchange beside
    a trainer's all-reduce hung once on two H200s, before a fix; see docs/benchmarks.md).
    """
    single_queue = device_max_connections is not None and device_max_connections.strip() == "1"
    if requested == "auto":
        return "nccl" if world_backend == "nccl" and not overlap else "gloo"
    if requested == "nccl" and world_backend != "nccl":
        raise ConfigError(flag("exchange_transport"), "nccl needs one GPU per rank; this run uses gloo")
    if requested == "nccl" and overlap and single_queue:
        raise ConfigError(
            flag("exchange_transport"),
            "nccl with overlap is refused under CUDA_DEVICE_MAX_CONNECTIONS=1: with one hardware queue the "
            "prefetch thread's all_to_all and the trainer's gradient all-reduce run in issue order, which differs "
            "across ranks, and training deadlocks. Use --exchange-transport gloo (overlap kept, CPU bytes) or "
            "--no-overlap-intra-microbatch-reorder (both collectives on the training thread)",
        )
    if requested == "nccl" and overlap:
        logging.getLogger(__name__).warning(
            "--exchange-transport nccl with overlap: NCCL kernels of the prefetch thread and of the trainer can "
            "be ordered differently on different ranks (a run of this kind hung once, before a fix). "
            "--exchange-transport gloo keeps the overlap without that risk."
        )
    return requested


def flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def exact_weight(value: float | int | str | Fraction, setting: str) -> Fraction:
    """A cost weight as an exact fraction: ``0.1`` means 1/10, not the nearest binary float."""
    if isinstance(value, bool):
        raise ConfigError(setting, f"must be a number, got {value!r}")
    try:
        weight = Fraction(str(value)) if not isinstance(value, Fraction) else value
    except (ValueError, ZeroDivisionError):
        raise ConfigError(setting, f"must be a number, got {value!r}") from None
    if weight < 0:
        raise ConfigError(setting, f"must not be negative, got {value}")
    return weight


@dataclass
class ReorderConfig:
    """The reordering switches, named as the run flags name them; embed it in a trainer's config."""

    scalable_dp: bool = False
    intra_microbatch_reorder: bool = False
    reorder_encoder_cost_weight: float = 1.0
    reorder_language_cost_weight: float = 0.0
    overlap_intra_microbatch_reorder: bool = True
    reorder_window_size: int = 1
    reorder_across_microbatches: bool = False

    def integer_cost_weights(self) -> tuple[int, int]:
        """(encoder, language) weights as coprime integers with the same ratio: exact, identical everywhere."""
        encoder = exact_weight(self.reorder_encoder_cost_weight, flag("reorder_encoder_cost_weight"))
        language = exact_weight(self.reorder_language_cost_weight, flag("reorder_language_cost_weight"))
        if encoder == 0 and language == 0:
            raise ConfigError(
                flag("reorder_encoder_cost_weight"),
                "and --reorder-language-cost-weight are both 0; at least one cost weight must be positive",
            )
        common = math.lcm(encoder.denominator, language.denominator)
        encoder_int, language_int = int(encoder * common), int(language * common)
        divisor = math.gcd(encoder_int, language_int)
        return encoder_int // divisor, language_int // divisor

    def validate(self) -> None:
        if not isinstance(self.reorder_window_size, int) or self.reorder_window_size < 1:
            raise ConfigError(flag("reorder_window_size"), f"must be an integer >= 1, got {self.reorder_window_size!r}")
        self.integer_cost_weights()
        if self.intra_microbatch_reorder and not self.scalable_dp:
            raise ConfigError(
                flag("intra_microbatch_reorder"),
                "needs --scalable-dp: reordering balances each rank's own canonical shard",
            )
        if self.reorder_across_microbatches and not self.intra_microbatch_reorder:
            raise ConfigError(flag("reorder_across_microbatches"), "needs --intra-microbatch-reorder")

    def check_padding(self, pad_to_seq_length: bool) -> None:
        """Reordering concatenates exchanged samples into one micro-batch: every rank pads alike."""
        if self.intra_microbatch_reorder and not pad_to_seq_length:
            raise ConfigError(
                flag("pad_to_seq_length"),
                "false is not supported with reordering: exchanged samples are concatenated back into one "
                "micro-batch, so every rank must pad to the same length",
            )


@dataclass
class PipelineConfig:
    """Everything a recipe needs to build one module rank's graph."""

    components: tuple[str, ...] = DEFAULT_COMPONENTS
    micro_batch_size: int = 8
    global_batch_size: int | None = None  # default: one window of micro-batches
    seq_length: int = 2048
    pad_to_seq_length: bool = True
    dataloader_type: str = "cyclic"
    drop_last: bool = True
    seed: int = 1234
    dataset: str | None = None  # None: the embedded synthetic dataset
    processor: str | None = None  # None: the embedded offline processor
    embedded_samples: int = 512
    num_workers: int = 2
    exchange_transport: str = "auto"
    exchange_timeout_s: float = 120.0
    reorder: ReorderConfig = field(default_factory=ReorderConfig)
    # Real data (docs/data.md): image paths relative to this folder; replace unreadable rows.
    image_folder: str | None = None
    skip_bad_samples: bool = False

    @property
    def microbatches_per_global_batch(self) -> int:
        global_batch = self.global_batch_size or self.micro_batch_size * self.reorder.reorder_window_size
        return global_batch // self.micro_batch_size

    def validate(self, world_size: int | None = None) -> Topology:
        """Check every setting against the others; return the topology. Raises ConfigError."""
        topology = build_topology(self.components, world_size)
        self.reorder.validate()
        self._validate_modules(topology)
        self._validate_batching(topology)
        if self.dataloader_type not in DATALOADER_TYPES:
            raise ConfigError(
                flag("dataloader_type"),
                f"{self.dataloader_type!r} is not supported with scalable data parallelism; use single or cyclic",
            )
        if not self.drop_last:
            raise ConfigError(
                flag("drop_last"), "false is not supported: scalable data parallelism needs full global micro-batches"
            )
        self.reorder.check_padding(self.pad_to_seq_length)
        if self.seq_length < 1:
            raise ConfigError(flag("seq_length"), f"must be >= 1, got {self.seq_length}")
        if self.num_workers < 0:
            raise ConfigError(flag("num_workers"), f"must be >= 0, got {self.num_workers}")
        if self.exchange_transport not in EXCHANGE_TRANSPORTS:
            raise ConfigError(flag("exchange_transport"), f"must be one of {', '.join(EXCHANGE_TRANSPORTS)}")
        if not self.exchange_timeout_s > 0:
            raise ConfigError(flag("exchange_timeout_s"), f"must be positive, got {self.exchange_timeout_s}")
        for setting in ("dataset", "processor"):
            path = getattr(self, setting)
            if path is not None and not os.path.exists(path) and not glob.has_magic(path):
                raise ConfigError(flag(setting), f"{path} does not exist")
        if self.image_folder is not None and not os.path.isdir(self.image_folder):
            raise ConfigError(flag("image_folder"), f"{self.image_folder} is not a folder")
        return topology

    def _validate_modules(self, topology: Topology) -> None:
        language = topology.language
        for module in topology.modules:
            if module.etp > 1:
                raise ConfigError(
                    COMPONENT_FLAG, f"{module.name}: expert tensor parallelism (etp={module.etp}) > 1 is not supported"
                )
        for encoder in topology.encoders:
            if encoder.pp > 1:
                raise ConfigError(COMPONENT_FLAG, f"{encoder.name}: encoder pipeline parallelism (pp={encoder.pp}) > 1 is not supported")
            if encoder.dp > language.dp:
                raise ConfigError(
                    COMPONENT_FLAG,
                    f"{encoder.name} dp={encoder.dp} exceeds language dp={language.dp}: the bridge fan-in with "
                    "variable image-token counts is not implemented in megatron-core",
                )
            if language.dp % encoder.dp:
                raise ConfigError(
                    COMPONENT_FLAG,
                    f"language dp={language.dp} is not a multiple of {encoder.name} dp={encoder.dp}: each encoder "
                    "replica must feed a contiguous block of language replicas",
                )

    def _validate_batching(self, topology: Topology) -> None:
        batch = self.micro_batch_size
        if batch < 1:
            raise ConfigError(flag("micro_batch_size"), f"must be >= 1, got {batch}")
        slots = topology.grid_size
        if batch % slots:
            raise ConfigError(
                flag("micro_batch_size"),
                f"{batch} is not divisible by the canonical grid size {slots} (lcm of the modules' dp sizes)",
            )
        if self.global_batch_size is not None and (self.global_batch_size < batch or self.global_batch_size % batch):
            raise ConfigError(
                flag("global_batch_size"), f"{self.global_batch_size} is not a multiple of --micro-batch-size {batch}"
            )
        window = self.reorder.reorder_window_size
        if self.reorder.reorder_across_microbatches and self.microbatches_per_global_batch % window:
            raise ConfigError(
                flag("reorder_window_size"),
                f"{window} must divide the {self.microbatches_per_global_batch} micro-batches of a global batch "
                "when samples move across micro-batches (a window never crosses a global batch)",
            )


@dataclass
class JobOptions:
    """What ``mimo-pipes run`` does besides building the graph."""

    steps: int = 32
    recipe: str = "mimo_pipes_recipes.vlm_sft"
    dump_assignments: str | None = None
    stop_after: int | None = None
    save_state: str | None = None
    resume: str | None = None
    progress: bool = True
