"""What each module's micro-batches carry, declared once.

A module's role follows from its name (``--component``): ``language`` is the language model, every
other module a vision encoder. Each makes and moves only the fields it trains on:

===========  =====================================================================================
role         model fields its micro-batches carry
===========  =====================================================================================
language     token fields (``input_ids``, ``attention_mask``, ``labels``, ``loss_mask``,
             ``position_ids``) and layout fields
encoder      pixel fields (``pixel_values``, ``pixel_values_videos``), ``input_ids`` and layout fields
all          every field (a graph built without a module name: ``RankLayout.module`` None)
===========  =====================================================================================

Every module also carries the layout fields (``image_grid_thw``, ``video_grid_thw``,
``image_num_tiles``: how many images a sample has and their shapes, which the language side needs for its
positions and the bridge for its pairing checks), the metadata lists (``sample_ids``, ``image_tokens``,
...) and every key a row passes through unchanged. The costs are computed before any field is dropped,
from values identical on every module.

An encoder keeps ``input_ids`` (one row per sample, never packed): on an encoder rank megatron-core's
``MimoModel`` counts each sample's placeholders in them to split its flat output per sample, and its bridge
sends each language peer the rows of that peer's samples (:mod:`mimo_pipes.megatron.routing`). Without them
it would split by equal row counts, and embeddings of images of different sizes would reach the wrong rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from mimo_pipes.samples.sample import CONCAT_FIELDS, SEQUENCE_FIELDS, Sample

LANGUAGE = "language"
ENCODER = "encoder"
ALL = "all"
ROLES = (LANGUAGE, ENCODER, ALL)

TOKEN_FIELDS: tuple[str, ...] = SEQUENCE_FIELDS
# The token fields an encoder keeps: what MimoModel reads on an encoder rank to split its output per sample.
ENCODER_TOKEN_FIELDS: tuple[str, ...] = ("input_ids",)
PIXEL_FIELDS: tuple[str, ...] = ("pixel_values", "pixel_values_videos")
LAYOUT_FIELDS: tuple[str, ...] = tuple(name for name in CONCAT_FIELDS if name not in PIXEL_FIELDS)


@dataclass(frozen=True)
class ModuleFields:
    """The fields one module's micro-batches carry (see the module doc)."""

    role: str = ALL

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")

    @property
    def dropped(self) -> tuple[str, ...]:
        """The model fields this module never carries."""
        encoder = tuple(name for name in TOKEN_FIELDS if name not in ENCODER_TOKEN_FIELDS)
        return {LANGUAGE: PIXEL_FIELDS, ENCODER: encoder, ALL: ()}[self.role]

    @property
    def packs(self) -> bool:
        """Whether sequence packing packs the micro-batches: the language model's do; an encoder's ``input_ids``
        stay one row per sample, the rows megatron-core splits its output by."""
        return self.role != ENCODER

    @property
    def pixels(self) -> bool:
        """Whether the micro-batches carry pixels (only then are images decoded)."""
        return self.role != LANGUAGE

    def carries(self, name: str) -> bool:
        return name not in self.dropped

    def select(self, sample: Sample) -> Sample:
        """``sample`` without the fields this module does not carry (the same dict when it has none)."""
        if not any(name in sample for name in self.dropped):
            return sample
        return {name: value for name, value in sample.items() if name not in self.dropped}


def module_fields(module: str | None) -> ModuleFields:
    """The fields of the module named ``module`` (None: every field)."""
    if module is None:
        return ModuleFields(ALL)
    return ModuleFields(LANGUAGE if module == LANGUAGE else ENCODER)
