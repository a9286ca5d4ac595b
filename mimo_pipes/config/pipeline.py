"""The user's configuration: :class:`PipelineConfig` and the :class:`ReorderConfig` inside it, and their checks,
which run before any data is read.

Field names follow the run flags (``reorder_window_size`` is ``--reorder-window-size``), so a trainer's
config can embed :class:`ReorderConfig`. An error names the setting as the user wrote it: the field in Python
(``micro_batch_size``), the flag inside a ``mimo-pipes`` command (``--micro-batch-size``; see
:mod:`mimo_pipes.config.flags`).
"""

from __future__ import annotations

import glob
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from fractions import Fraction

import numpy as np

from mimo_pipes.config.counts import as_count
from mimo_pipes.config.flags import cli_flag, flag
from mimo_pipes.config.planner import planner_settings, two_level_groups
from mimo_pipes.config.processing import check_processing
from mimo_pipes.errors import ConfigError, name_flags_as_fields
from mimo_pipes.parallel.pairing import pairing_problem
from mimo_pipes.parallel.topology import Topology, build_topology
from mimo_pipes.samples.cost_range import check_cost_range
from mimo_pipes.time_model.model import TimeModel, TimeModelError, load_time_model

DATALOADER_TYPES = ("single", "cyclic")
EXCHANGE_TRANSPORTS = ("auto", "gloo", "nccl")
EXCHANGE_PAYLOADS = ("rows", "samples")
"""What the exchange moves: dataset rows (processed after it, on the rank that trains on them) or processed samples."""
DEFAULT_COMPONENTS = ("language=tp=1,pp=1,dp=2,rank_offset=0", "images=tp=1,dp=2,rank_offset=2")
LANGUAGE_COSTS = ("tokens", "packed")
DEFAULT_READ_AHEAD = 2
"""Micro-batches a pipeline's loader makes ahead of the training thread unless told otherwise (``--read-ahead``)."""
DEFAULT_ATTENTION_CROSSOVER = 12 * 4096  # causal decoder, hidden size 4096, 4h MLP (see docs/sequence-packing.md)


def check_pack_pad_multiple(value: object) -> int:
    return as_count(value, flag("pack_pad_multiple"), minimum=1)


def check_exchange_payload(value: object) -> None:
    if value not in EXCHANGE_PAYLOADS:
        raise ConfigError(flag("exchange_payload"), f"must be one of {', '.join(EXCHANGE_PAYLOADS)}, got {value!r}")


OPTIONAL_COUNTS = ("global_batch_size", "stop_after", "num_workers")
"""Integer settings whose None means something (one window of micro-batches; run to --steps; the cores this rank
may use, :mod:`mimo_pipes.config.workers`)."""


def take_counts(settings: object, counts: Mapping[str, int | None]) -> None:
    """The integer settings of ``settings`` named in ``counts`` as ints at least their minimum there (None: any
    integer): numpy and torch integers become ints; a float, bool, string or a value below the minimum is
    refused naming the setting (:func:`~mimo_pipes.config.flags.flag`), before anything is built from it."""
    for name, minimum in counts.items():
        value = getattr(settings, name)
        if value is not None or name not in OPTIONAL_COUNTS:
            object.__setattr__(settings, name, as_count(value, flag(name), minimum=minimum))


def take_switches(settings: object, names: tuple[str, ...]) -> None:
    """The on/off settings ``names`` as bools (numpy's bool too); anything else, the string "false" above all
    (true to Python), is refused naming the setting."""
    for name in names:
        value = getattr(settings, name)
        if not isinstance(value, (bool, np.bool_)):
            raise ConfigError(flag(name), f"must be True or False, got {value!r} (a {type(value).__name__})")
        object.__setattr__(settings, name, bool(value))


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

    COUNTS = {"reorder_window_size": 1, "reorder_attention_crossover": 1}
    SWITCHES = ("scalable_dp", "intra_microbatch_reorder", "overlap_intra_microbatch_reorder", "reorder_across_microbatches",
                "reorder_two_level")

    def __post_init__(self) -> None:
        take_counts(self, self.COUNTS)
        take_switches(self, self.SWITCHES)

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
                f"and {flag('reorder_language_cost_weight')} are both 0; at least one cost weight must be positive",
            )
        square = Fraction(0)
        if self.reorder_language_cost == "packed":
            crossover = as_count(self.reorder_attention_crossover, flag("reorder_attention_crossover"), minimum=1)
            square = language / crossover
        common = math.lcm(encoder.denominator, language.denominator, square.denominator)
        terms = [int(weight * common) for weight in (encoder, language, square)]
        divisor = math.gcd(*terms)
        return terms[0] // divisor, terms[1] // divisor, terms[2] // divisor

    def validate(self) -> None:
        take_counts(self, self.COUNTS)
        take_switches(self, self.SWITCHES)
        if self.reorder_language_cost not in LANGUAGE_COSTS:
            raise ConfigError(flag("reorder_language_cost"), f"must be one of {', '.join(LANGUAGE_COSTS)}, got {self.reorder_language_cost!r}")
        _, language = self.integer_cost_weights()
        if self.reorder_language_cost == "packed" and language == 0:
            raise ConfigError(
                flag("reorder_language_cost"),
                f"packed has no effect with {flag('reorder_language_cost_weight')} 0; give the language term a positive weight",
            )
        if self.intra_microbatch_reorder and not self.scalable_dp:
            raise ConfigError(
                flag("intra_microbatch_reorder"),
                f"needs {flag('scalable_dp')}: reordering balances each rank's own canonical shard",
            )
        if self.reorder_across_microbatches and not self.intra_microbatch_reorder:
            raise ConfigError(flag("reorder_across_microbatches"), f"needs {flag('intra_microbatch_reorder')}")
        if self.reorder_two_level and not self.intra_microbatch_reorder:
            raise ConfigError(flag("reorder_two_level"), f"needs {flag('intra_microbatch_reorder')}")
        self.load_time_model()

    def check_padding(self, pad_to_seq_length: bool) -> None:
        """Reordering concatenates exchanged samples into one micro-batch: every rank pads alike."""
        if self.intra_microbatch_reorder and not pad_to_seq_length:
            raise ConfigError(
                flag("pad_to_seq_length"),
                "false is not supported with reordering: exchanged samples are concatenated back into one "
                "micro-batch, so every rank must pad to the same length",
            )


def reorder_window_size(reorder: ReorderConfig) -> int:
    """Micro-batches balanced together: ``--reorder-window-size`` when reordering, else 1."""
    return reorder.reorder_window_size if reorder.intra_microbatch_reorder else 1


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
    num_workers: int | None = None  # None: the cores this rank may use, less its own threads (config/workers.py)
    # Where the workers process samples: auto (worker processes with 2+ workers where they start, else threads),
    # thread or process (config/processing.py); the stream is the same.
    processing: str = "auto"
    exchange_transport: str = "auto"
    exchange_timeout_s: float = 120.0
    reorder: ReorderConfig = field(default_factory=ReorderConfig)
    # Sequence packing (THD) of each rank's collated micro-batch, after reordering.
    pack_sequences_in_batch: bool = False
    pack_pad_multiple: int = 1  # pad every packed sequence to a multiple of this (2 x cp with context parallelism)
    # Real data (docs/data.md): image paths relative to this folder; replace unreadable rows.
    image_folder: str | None = None
    split_part: str = "train"  # the split part of an Energon dataset or metadataset (Energon's name)
    skip_bad_samples: bool = False
    # What the exchange moves (docs/design.md): dataset rows, processed after it on the rank that trains on
    # them, or processed samples; rows keep their images' paths only when every rank reads the same files.
    exchange_payload: str = "rows"
    exchange_image_paths: bool = False
    # Whole micro-batches (collated) the loader makes ahead of the training thread on a thread of its own; 0: none.
    # Its state is always the state at the last micro-batch handed out (docs/configuration.md).
    read_ahead: int = DEFAULT_READ_AHEAD

    # Each integer setting and its least value: checked at construction, again by validate (a field set since).
    COUNTS = {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 1, "seed": 0, "embedded_samples": 1, "num_workers": 0,
              "pack_pad_multiple": 1, "read_ahead": 0}
    SWITCHES = ("pad_to_seq_length", "drop_last", "pack_sequences_in_batch", "skip_bad_samples", "exchange_image_paths")

    def __post_init__(self) -> None:
        self._take_kinds()

    def _take_kinds(self) -> None:
        """Each setting of the kind it must be, counts as ints (see ``COUNTS``): checked when made, and by validate."""
        take_counts(self, self.COUNTS)
        take_switches(self, self.SWITCHES)
        if isinstance(self.components, str) or not all(isinstance(spec, str) for spec in self.components):
            raise ConfigError(flag("components"), f"must be a list of module specs (strings), got {self.components!r}")
        check_processing(self.processing)
        timeout = self.exchange_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not math.isfinite(timeout) or timeout <= 0:
            raise ConfigError(flag("exchange_timeout_s"), f"must be a positive number of seconds, got {timeout!r}")

    @property
    def microbatches_per_global_batch(self) -> int:
        global_batch = self.global_batch_size or self.micro_batch_size * self.reorder.reorder_window_size
        return global_batch // self.micro_batch_size

    def validate(self, world_size: int | None = None) -> Topology:
        """Check every setting against the others; return the topology. Raises ConfigError."""
        self._take_kinds()
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
        self.check_cost_range(topology)
        if self.exchange_transport not in EXCHANGE_TRANSPORTS:
            raise ConfigError(flag("exchange_transport"), f"must be one of {', '.join(EXCHANGE_TRANSPORTS)}")
        check_pack_pad_multiple(self.pack_pad_multiple)
        check_exchange_payload(self.exchange_payload)
        if self.exchange_image_paths and self.exchange_payload != "rows":
            raise ConfigError(flag("exchange_image_paths"), f"needs {flag('exchange_payload')} rows: processed samples carry no image files")
        if self.dataset is None and self.embedded_samples < self.micro_batch_size:
            raise ConfigError(flag("embedded_samples"), f"{self.embedded_samples} is fewer than one micro-batch ({flag('micro_batch_size')} "
                                                        f"{self.micro_batch_size})")
        for setting in ("dataset", "processor"):
            path = getattr(self, setting)
            if path is not None and not _in_s3(path) and not os.path.exists(os.path.expanduser(path)) and not glob.has_magic(path):
                raise ConfigError(flag(setting), f"{path} does not exist")
        # s3:// URLs are checked by the data's own checks (a request each), before the ranks start.
        if self.image_folder is not None and not _in_s3(self.image_folder) and not os.path.isdir(os.path.expanduser(self.image_folder)):
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
                raise ConfigError(flag("components"), problem)

    def _validate_batching(self, topology: Topology) -> None:
        batch = self.micro_batch_size
        slots = topology.grid_size
        if batch % slots:
            raise ConfigError(
                flag("micro_batch_size"),
                f"{batch} is not divisible by the canonical grid size {slots} (lcm of the modules' dp sizes)",
            )
        if self.global_batch_size is not None and self.global_batch_size % batch:
            raise ConfigError(
                flag("global_batch_size"), f"{self.global_batch_size} is not a multiple of {flag('micro_batch_size')} {batch}"
            )
        window = self.reorder.reorder_window_size
        if self.reorder.reorder_across_microbatches and self.microbatches_per_global_batch % window:
            raise ConfigError(
                flag("reorder_window_size"),
                f"{window} must divide the {self.microbatches_per_global_batch} micro-batches of a global batch "
                "when samples move across micro-batches (a window never crosses a global batch)",
            )


def _in_s3(path: str) -> bool:
    """An ``s3://`` URL (as ``mimo_pipes.data.storage.s3_url.is_s3`` says; config sits below data and does not import it)."""
    return path.startswith("s3://")


# The data sources name a setting by its flag (``--dataset``); from Python, errors name the field it sets.
name_flags_as_fields({cli_flag(item.name): item.name for config in (PipelineConfig, ReorderConfig) for item in fields(config)})
