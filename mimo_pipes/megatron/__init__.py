"""Into megatron-core: the batches ``MimoModel.forward`` takes, the pipeline stages' keys, and resuming from a
Megatron checkpoint's sample count. Nothing here needs megatron-core itself except
:mod:`mimo_pipes.megatron.forward`, which imports it when called."""

from mimo_pipes.megatron.batch import FORWARD_KEYS, mimo_batch
from mimo_pipes.megatron.rope import mrope_position_ids
from mimo_pipes.megatron.settings import MimoBatchSettings
from mimo_pipes.megatron.stages import for_stage, stage_of

__all__ = ["FORWARD_KEYS", "MimoBatchSettings", "for_stage", "mimo_batch", "mrope_position_ids", "stage_of"]
