"""Into megatron-core: the batches ``MimoModel.forward`` takes, the pipeline stages' keys, the pipeline's layout
from the model's ``module_to_grid_map`` (and where the bridge routes an encoder's rows), and resuming from a
Megatron checkpoint's sample count; and what the Megatron recipes compose: the training device (``device``), each
module's process groups (``groups``), the forward step and loss megatron-core's schedules take (``step``).
megatron-core itself is imported only inside the functions that need it."""

from mimo_pipes.megatron.batch import FORWARD_KEYS, mimo_batch
from mimo_pipes.megatron.consumed import global_microbatch_size, microbatches_from_samples, samples_from_microbatches
from mimo_pipes.megatron.forward import ForwardSupport, fit_to_forward, forward_parameters, forward_support, require_mrope_and_packing
from mimo_pipes.megatron.grids import GridLayout, GridMapError, grid_layout, rank_layout
from mimo_pipes.megatron.inputs import MimoBatchError
from mimo_pipes.megatron.rope import mrope_position_ids
from mimo_pipes.megatron.settings import MimoBatchSettings
from mimo_pipes.megatron.stages import for_stage, stage_of

__all__ = [
    "FORWARD_KEYS", "ForwardSupport", "GridLayout", "GridMapError", "MimoBatchError", "MimoBatchSettings", "fit_to_forward", "for_stage",
    "forward_parameters", "forward_support", "global_microbatch_size", "grid_layout", "microbatches_from_samples", "mimo_batch",
    "mrope_position_ids", "rank_layout", "require_mrope_and_packing", "samples_from_microbatches", "stage_of",
]
