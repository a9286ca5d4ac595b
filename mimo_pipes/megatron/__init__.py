"""Into megatron-core: the batches ``MimoModel.forward`` takes, the pipeline stages' keys, and resuming from a
Megatron checkpoint's sample count. Nothing here needs megatron-core itself except
:func:`mimo_pipes.megatron.forward.mimo_forward`, which imports it when called."""

from mimo_pipes.megatron.batch import FORWARD_KEYS, mimo_batch
from mimo_pipes.megatron.consumed import microbatches_from_samples, samples_from_microbatches
from mimo_pipes.megatron.forward import fit_to_forward, forward_parameters
from mimo_pipes.megatron.inputs import MimoBatchError
from mimo_pipes.megatron.rope import mrope_position_ids
from mimo_pipes.megatron.settings import MimoBatchSettings
from mimo_pipes.megatron.stages import for_stage, stage_of

__all__ = [
    "FORWARD_KEYS", "MimoBatchError", "MimoBatchSettings", "fit_to_forward", "for_stage", "forward_parameters", "microbatches_from_samples", "mimo_batch",
    "mrope_position_ids", "samples_from_microbatches", "stage_of",
]
