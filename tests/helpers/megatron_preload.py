"""megatron-core's modules the Megatron scenarios use, and Megatron-Bridge's MIMO modules as the tests import them
(:func:`bridge_cpu.import_bridge`, when Bridge is installed): named in the 3.12 tier's rank-server preload
(``scripts/test312.sh``), so that every pool rank is forked with them imported. The scenario modules import
megatron-core lazily (inside the functions that need it), so preloading them alone left each of the tier's ten ranks
importing megatron-core on its first scenario, and each Bridge rank importing Bridge (some 9 CPU-s a rank).

Bridge's import is safe for the other scenarios of those ranks: what it changes in megatron-core, torch,
transformers and the library (every module attribute and class member compared by identity before and after, Bridge
0.6.2 on megatron-core 0.19.2) is megatron-core's cached TransformerEngine version (``0.0.0`` either way: none is
installed) and YaRN's concentration factor read from a config (Bridge's fix for configs whose YaRN field is None; 1.0
for configs without YaRN, as before); and the packing equivalence already trained on ranks that had imported it."""

from __future__ import annotations

import importlib
import importlib.util

MEGATRON_CORE = (
    "megatron.core.parallel_state", "megatron.core.tensor_parallel", "megatron.core.hyper_comm_grid",
    "megatron.core.num_microbatches_calculator", "megatron.core.distributed", "megatron.core.distributed.finalize_model_grads",
    "megatron.core.models.gpt", "megatron.core.models.gpt.gpt_layer_specs", "megatron.core.models.mimo",
    "megatron.core.models.mimo.submodules.vision", "megatron.core.optimizer", "megatron.core.transformer.transformer_config",
    "megatron.core.transformer.dot_product_attention", "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.bridge_communicator", "megatron.core.pipeline_parallel.multimodule_communicator",
    "megatron.core.process_groups_config", "megatron.core.dist_checkpointing",
)

if importlib.util.find_spec("megatron.core") is not None:
    for name in MEGATRON_CORE:
        importlib.import_module(name)
    if importlib.util.find_spec("megatron.bridge") is not None:
        from bridge_cpu import import_bridge

        import_bridge()
