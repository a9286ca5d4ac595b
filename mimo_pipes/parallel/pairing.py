"""How an encoder module may pair with the language module: the bridge's rules, stated once.

megatron-core moves an encoder's embeddings to the language module along the batch dimension, contiguously:
encoder DP replica ``i`` feeds language replicas ``[i*k, (i+1)*k)``, ``k = language dp / encoder dp``
(fan-out). The opposite direction (fan-in, encoder DP > language DP) is refused: megatron-core's
``MimoModel`` asserts encoder DP <= language DP once the samples of a micro-batch hold different numbers of
image tokens, which is what real data does. Every path that lays out modules (``--component``, a Megatron
``module_to_grid_map``) checks a pair here.
"""

from __future__ import annotations

from mimo_pipes.parallel.topology import ModuleSpec

FAN_IN_LIMIT = (
    "fan-in (encoder dp > language dp) is not supported by megatron-core: its MimoModel asserts encoder DP <= "
    "language DP when the samples' image-token counts differ"
)


def pairing_problem(encoder: ModuleSpec, language: ModuleSpec) -> str | None:
    """Why ``encoder`` cannot feed ``language`` (one line naming the encoder), or None when it can."""
    if encoder.pp > 1:
        return f"{encoder.name}: encoder pipeline parallelism (pp={encoder.pp}) > 1 is not supported"
    if encoder.dp > language.dp:
        return f"{encoder.name} dp={encoder.dp} exceeds language dp={language.dp}: {FAN_IN_LIMIT}"
    if language.dp % encoder.dp:
        return (f"language dp={language.dp} is not a multiple of {encoder.name} dp={encoder.dp}: each encoder replica "
                "must feed a contiguous block of language replicas")
    return None
