"""The user's configuration and what is derived from it.

``pipeline.py`` holds :class:`PipelineConfig` and the :class:`ReorderConfig` inside it (public: import them from
here), named as the run flags name them (``flags.py``), with their checks. Derived from them: the exchange's
transport (``transport.py``), the planners' settings (``planner.py``) and the settings every node of a graph's
tail takes (``tail_settings.py``). What ``mimo-pipes run`` and ``train`` do besides building the graph: ``job_options.py``.
"""

from mimo_pipes.config.flags import flag
from mimo_pipes.config.pipeline import (
    DATALOADER_TYPES,
    DEFAULT_ATTENTION_CROSSOVER,
    DEFAULT_COMPONENTS,
    DEFAULT_READ_AHEAD,
    EXCHANGE_PAYLOADS,
    EXCHANGE_TRANSPORTS,
    LANGUAGE_COSTS,
    WEIGHT_DECIMALS,
    PipelineConfig,
    ReorderConfig,
    check_exchange_payload,
    check_pack_pad_multiple,
    exact_weight,
    reorder_window_size,
)

__all__ = [
    "DATALOADER_TYPES",
    "DEFAULT_ATTENTION_CROSSOVER",
    "DEFAULT_COMPONENTS",
    "DEFAULT_READ_AHEAD",
    "EXCHANGE_PAYLOADS",
    "EXCHANGE_TRANSPORTS",
    "LANGUAGE_COSTS",
    "PipelineConfig",
    "ReorderConfig",
    "WEIGHT_DECIMALS",
    "check_exchange_payload",
    "check_pack_pad_multiple",
    "exact_weight",
    "flag",
    "reorder_window_size",
]
