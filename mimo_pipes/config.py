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

from mimo_pipes.balance.settings import PlannerSettings
from mimo_pipes.errors import ConfigError
from mimo_pipes.parallel.pairing import pairing_problem
from mimo_pipes.parallel.topology import COMPONENT_FLAG, Topology, build_topology
from mimo_pipes.samples.cost_range import check_cost_range
from mimo_pipes.time_model.model import TimeModel, TimeModelError, load_time_model

DATALOADER_TYPES = ("single", "cyclic")
EXCHANGE_TRANSPORTS = ("auto", "gloo", "nccl")
EXCHANGE_PAYLOADS = ("rows", "samples")
"""What the exchange moves: dataset rows (processed after it, on the rank that trains on them) or processed samples."""
DEFAULT_COMPONENTS = ("language=tp=1,pp=1,dp=2,rank_offset=0", "images=tp=1,dp=2,rank_offset=2")
LANGUAGE_COSTS = ("tokens", "packed")
DEFAULT_ATTENTION_CROSSOVER = 12 * 4096  # causal decoder, hidden size 4096, 4h MLP (see docs/sequence-packing.md)


def resolve_exchange_transport(requested: str, world_backend: str, overlap: bool, device_max_connections: str | None,
                               warn: bool = True) -> str:
    """The backend of the exchange group: ``gloo`` (CPU bytes) or ``nccl`` (bytes staged through the GPU).

    ``auto`` takes NCCL only for an exchange on the training thread of an NCCL run; an overlapped exchange
    goes over Gloo, which cannot contend with the trainer's NCCL kernels (an overlapped NCCL exchange beside
    a trainer's all-reduce hung once on two H200s, before a fix; see docs/benchmarks.md). ``warn`` False:
    the risky choice is not logged (a job says it once, before its ranks start).
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
    if requested == "nccl" and overlap and warn:
        logging.getLogger(__name__).warning(
            "--exchange-transport nccl with overlap: NCCL kernels of the prefetch thread and of the trainer can "
            "be ordered differently on different ranks (a run of this kind hung once, before a fix). "
            "--exchange-transport gloo keeps the overlap without that risk."
        )
    return requested


def check_pack_pad_multiple(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(flag("pack_pad_multiple"), f"must be an integer >= 1, got {value!r}")


def check_exchange_payload(value: object) -> None:
    if value not in EXCHANGE_PAYLOADS:
        raise ConfigError(flag("exchange_payload"), f"must be one of {', '.join(EXCHANGE_PAYLOADS)}, got {value!r}")


def flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


WEIGHT_DECIMALS = 6
"""Cost weights are read exactly to this many decimal places (a fraction p/q with q <= 10**6 too)."""


def exact_weight(value: float | int | str | Fraction, setting: str) -> Fraction:
    """A cost weight as an exact fraction: ``0.1`` means 1/10, not the nearest binary float.

    A weight finer than :data:`WEIGHT_DECIMALS` places (``0.30000000000000004``, what ``0.1 + 0.2`` prints)
    is refused with its rounding: read exactly, such noise would make integer weights of 17 digits whose
    costs leave the planners' int64 range."""
    if isinstance(value, bool):
        raise ConfigError(setting, f"must be a number, got {value!r}")
    try:
        weight = Fraction(str(value)) if not isinstance(value, Fraction) else value
    except (ValueError, ZeroDivisionError):
        raise ConfigError(setting, f"must be a number, got {value!r}") from None
    if weight < 0:
        raise ConfigError(setting, f"must not be negative, got {value}")
    scale = 10**WEIGHT_DECIMALS
    if weight.denominator > scale:
        whole, part = divmod(round(weight * scale), scale)
        hint = f"{whole}.{part:0{WEIGHT_DECIMALS}d}".rstrip("0").rstrip(".")
        raise ConfigError(setting, f"{value}: weights are read exactly with at most {WEIGHT_DECIMALS} decimal places "
                                   f"(or as p/q with q <= {scale}); did you mean {hint}?")
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
    # Language term of a sample's cost: "tokens" = real tokens L; "packed" = L + L**2 / crossover, what a
    # language rank's time grows with when its micro-batch is packed (linear layers plus attention).
    reorder_language_cost: str = "tokens"
    reorder_attention_crossover: int = DEFAULT_ATTENTION_CROSSOVER
    # Time model of the vision encoder (a file of `mimo-pipes calibrate`); None: cost linear in image tokens.
    reorder_cost_model: str | None = None
    # Language dp = k * encoder dp, k > 1: encoder replicas by encoder cost, their k slots by real tokens.
    reorder_two_level: bool = False

    def load_time_model(self) -> TimeModel | None:
        """The time model of ``reorder_cost_model`` (None without one); a bad file is a ConfigError."""
        if self.reorder_cost_model is None:
            return None
        try:
            return load_time_model(self.reorder_cost_model)
        except TimeModelError as error:
            raise ConfigError(flag("reorder_cost_model"), str(error)) from None

    def integer_cost_weights(self) -> tuple[int, int]:
        """(encoder, language) weights as integers with the same ratio: exact, identical everywhere.
        Coprime together with :meth:`integer_language_square_weight`."""
        encoder, language, _ = self._integer_cost_terms()
        return encoder, language

    def integer_language_square_weight(self) -> int:
        """Weight of real_tokens**2 in a sample's cost, on the scale of :meth:`integer_cost_weights`:
        ``language / crossover`` with ``--reorder-language-cost packed``, else 0."""
        return self._integer_cost_terms()[2]

    def _integer_cost_terms(self) -> tuple[int, int, int]:
        encoder = exact_weight(self.reorder_encoder_cost_weight, flag("reorder_encoder_cost_weight"))
        language = exact_weight(self.reorder_language_cost_weight, flag("reorder_language_cost_weight"))
        if encoder == 0 and language == 0:
            raise ConfigError(
                flag("reorder_encoder_cost_weight"),
                "and --reorder-language-cost-weight are both 0; at least one cost weight must be positive",
            )
        square = Fraction(0)
        if self.reorder_language_cost == "packed":
            crossover = self.reorder_attention_crossover
            if isinstance(crossover, bool) or not isinstance(crossover, int) or crossover < 1:
                raise ConfigError(flag("reorder_attention_crossover"), f"must be an integer >= 1, got {crossover!r}")
            square = language / crossover
        common = math.lcm(encoder.denominator, language.denominator, square.denominator)
        terms = [int(weight * common) for weight in (encoder, language, square)]
        divisor = math.gcd(*terms)
        return terms[0] // divisor, terms[1] // divisor, terms[2] // divisor

    def validate(self) -> None:
        if not isinstance(self.reorder_window_size, int) or self.reorder_window_size < 1:
            raise ConfigError(flag("reorder_window_size"), f"must be an integer >= 1, got {self.reorder_window_size!r}")
        if self.reorder_language_cost not in LANGUAGE_COSTS:
            raise ConfigError(flag("reorder_language_cost"), f"must be one of {', '.join(LANGUAGE_COSTS)}, got {self.reorder_language_cost!r}")
        _, language = self.integer_cost_weights()
        if self.reorder_language_cost == "packed" and language == 0:
            raise ConfigError(
                flag("reorder_language_cost"),
                "packed has no effect with --reorder-language-cost-weight 0; give the language term a positive weight",
            )
        if self.intra_microbatch_reorder and not self.scalable_dp:
            raise ConfigError(
                flag("intra_microbatch_reorder"),
                "needs --scalable-dp: reordering balances each rank's own canonical shard",
            )
        if self.reorder_across_microbatches and not self.intra_microbatch_reorder:
            raise ConfigError(flag("reorder_across_microbatches"), "needs --intra-microbatch-reorder")
        if self.reorder_two_level and not self.intra_microbatch_reorder:
            raise ConfigError(flag("reorder_two_level"), "needs --intra-microbatch-reorder")
        self.load_time_model()

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
    # Sequence packing (THD) of each rank's collated micro-batch, after reordering.
    pack_sequences_in_batch: bool = False
    pack_pad_multiple: int = 1  # pad every packed sequence to a multiple of this (2 x cp with context parallelism)
    # Real data (docs/data.md): image paths relative to this folder; replace unreadable rows.
    image_folder: str | None = None
    skip_bad_samples: bool = False
    # What the exchange moves (docs/design.md): dataset rows, processed after it on the rank that trains on
    # them, or processed samples; rows keep their images' paths only when every rank reads the same files.
    exchange_payload: str = "rows"
    exchange_image_paths: bool = False

    @property
    def microbatches_per_global_batch(self) -> int:
        global_batch = self.global_batch_size or self.micro_batch_size * self.reorder.reorder_window_size
        return global_batch // self.micro_batch_size

    def validate(self, world_size: int | None = None) -> Topology:
        """Check every setting against the others; return the topology. Raises ConfigError."""
        topology = build_topology(self.components, world_size)
        self.reorder.validate()
        self._validate_modules(topology)
        if self.reorder.reorder_two_level:
            two_level_groups(topology)
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
        self.check_cost_range(topology)
        if self.num_workers < 0:
            raise ConfigError(flag("num_workers"), f"must be >= 0, got {self.num_workers}")
        if self.exchange_transport not in EXCHANGE_TRANSPORTS:
            raise ConfigError(flag("exchange_transport"), f"must be one of {', '.join(EXCHANGE_TRANSPORTS)}")
        check_pack_pad_multiple(self.pack_pad_multiple)
        check_exchange_payload(self.exchange_payload)
        if self.exchange_image_paths and self.exchange_payload != "rows":
            raise ConfigError(flag("exchange_image_paths"), "needs --exchange-payload rows: processed samples carry no image files")
        if not self.exchange_timeout_s > 0:
            raise ConfigError("--exchange-timeout", f"must be positive, got {self.exchange_timeout_s}")
        for setting in ("dataset", "processor"):
            path = getattr(self, setting)
            if path is not None and not os.path.exists(os.path.expanduser(path)) and not glob.has_magic(path):
                raise ConfigError(flag(setting), f"{path} does not exist")
        if self.image_folder is not None and not os.path.isdir(os.path.expanduser(self.image_folder)):
            raise ConfigError(flag("image_folder"), f"{self.image_folder} is not a folder")
        return topology

    def check_cost_range(self, topology: Topology, window_microbatches: int | None = None) -> None:
        """Every cost a sample of --seq-length tokens can have fits the planners' int64 sums over a window
        (``window_microbatches``, default the run's own): ConfigError naming the weight, the time model or
        --seq-length (see :mod:`mimo_pipes.samples.cost_range`)."""
        reorder = self.reorder
        model = reorder.load_time_model()
        window = window_microbatches or (reorder.reorder_window_size if reorder.intra_microbatch_reorder else 1)
        check_cost_range(
            (*reorder.integer_cost_weights(), reorder.integer_language_square_weight()), model,
            max_tokens=self.seq_length, micro_batch_size=self.micro_batch_size, window_microbatches=window,
            floor=planner_settings(topology, reorder, model).floor,
        )

    def _validate_modules(self, topology: Topology) -> None:
        for encoder in topology.encoders:
            problem = pairing_problem(encoder, topology.language)
            if problem is not None:
                raise ConfigError(COMPONENT_FLAG, problem)

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


def two_level_groups(topology: Topology) -> int:
    """d_enc for two-level balance: every encoder has the same dp, and language dp is k > 1 times it."""
    sizes = sorted({encoder.dp for encoder in topology.encoders})
    language = topology.language.dp
    if len(sizes) != 1 or language // sizes[0] < 2:
        raise ConfigError(
            flag("reorder_two_level"),
            f"needs every encoder at one dp that language dp={language} is a multiple k > 1 of; encoder dp: {sizes}",
        )
    return sizes[0]


def planner_settings(topology: Topology, reorder: ReorderConfig, model: TimeModel | None) -> PlannerSettings:
    """From the component specs every rank knows: the floor in cost units and the two-level grouping.

    One level: the floor, scaled by the encoder weight, is spread over the G/d_enc slots of one encoder
    forward (the smallest encoder dp when encoders differ). Two levels: the encoder level balances
    encoder cost alone, so the floor is the model's, per group (one group = one encoder forward)."""
    floor_ns = model.floor_ns if model is not None else 0
    if reorder.reorder_two_level:
        return PlannerSettings(floor=floor_ns, encoder_groups=two_level_groups(topology))
    encoder_weight, _ = reorder.integer_cost_weights()
    encoders = [encoder.dp for encoder in topology.encoders]
    slots_per_forward = topology.grid_size // min(encoders) if encoders else 1
    return PlannerSettings(floor=encoder_weight * floor_ns // slots_per_forward)


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
    # Exchange metrics (mimo_pipes.observe.metrics), written by DP rank 0 of each module.
    tensorboard: str | None = None  # event files under DIR/<module>/
    log_interval: int = 20  # a metrics line every N windows and at the end (0: only at the end)
    summary_json: str | None = None  # `run` writes its summary here as JSON (rank 0)


@dataclass
class TrainOptions(JobOptions):
    """What ``mimo-pipes train`` adds to run's options: the recipe trains instead of only reading."""

    recipe: str = "mimo_pipes_recipes.tiny_mimo_train"
    lr: float = 0.1
    vision_tower: str = "tiny"
