"""The user's configuration: :class:`PipelineConfig` and the :class:`ReorderConfig` inside it, named as the run
flags name them (``pipeline.py``); and what is derived from it once (``tail_settings.py``: the settings every node
of a graph's tail takes)."""

from mimo_pipes.config.pipeline import (  # noqa: F401
    DATALOADER_TYPES,
    DEFAULT_ATTENTION_CROSSOVER,
    DEFAULT_COMPONENTS,
    EXCHANGE_PAYLOADS,
    EXCHANGE_TRANSPORTS,
    LANGUAGE_COSTS,
    WEIGHT_DECIMALS,
    JobOptions,
    PipelineConfig,
    ReorderConfig,
    TrainOptions,
    check_exchange_payload,
    check_pack_pad_multiple,
    exact_weight,
    flag,
    planner_settings,
    resolve_exchange_transport,
    two_level_groups,
)
