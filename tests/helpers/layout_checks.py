"""Checks of the invariants of docs/design.md over the per-rank records a multi-rank run returns."""

from __future__ import annotations

from collections import defaultdict

from mimo_pipes.parallel.sharding import global_microbatch_indices
from mimo_pipes.testing import image_tokens_for


def module_sequences(results: list[dict | None]) -> dict[str, dict[int, list[int]]]:
    """Per module, per step: the module's B sample ids in canonical order (its DP ranks concatenated).

    Every TP/PP peer of a DP rank must hold exactly the same samples; that is checked here too.
    """
    by_module: dict[str, dict[tuple[int, int], dict[int, list]]] = defaultdict(lambda: defaultdict(dict))
    for result in filter(None, results):
        line = (result["tp_rank"], result["pp_rank"])
        by_module[result["module"]][line][result["dp_rank"]] = {r["step"]: r["sample_ids"] for r in result["records"]}
    sequences: dict[str, dict[int, list[int]]] = {}
    for module, lines in by_module.items():
        reference = None
        for line, ranks in sorted(lines.items()):
            steps = sorted(ranks[0])
            sequence = {step: [sid for dp_rank in sorted(ranks) for sid in ranks[dp_rank][step]] for step in steps}
            if reference is None:
                reference = sequence
            assert sequence == reference, f"{module}: TP/PP peers {line} hold other samples than their peers"
        sequences[module] = reference
    return sequences


def check_invariants(results, *, micro_batch_size, seed, window_size=1, across=False, shuffle=True, dataset_size=4096):
    """Conservation, agreement between modules, fan-out pairing; returns the module sequences."""
    sequences = module_sequences(results)
    modules = sorted(sequences)
    first = sequences[modules[0]]
    for module in modules[1:]:
        assert sequences[module] == first, f"modules {modules[0]} and {module} disagree on the assignment"
    steps = sorted(first)
    assert steps == list(range(len(steps))), f"steps are not consecutive from 0: {steps[:10]}"
    groups = [steps[i : i + window_size] for i in range(0, len(steps), window_size)] if across else [[s] for s in steps]
    for group in groups:
        before = sorted(int(i) for s in group for i in global_microbatch_indices(s, dataset_size, micro_batch_size, seed, shuffle))
        after = sorted(sid for s in group for sid in first[s])
        assert before == after, f"steps {group}: samples lost or duplicated"
        tokens_before = sum(image_tokens_for(i, seed) for i in before)
        tokens_after = sum(image_tokens_for(i, seed) for i in after)
        assert tokens_before == tokens_after
    for step in steps:
        assert len(first[step]) == micro_batch_size
    return sequences


def check_fanout(results: list[dict | None], encoder: str, language: str = "language") -> None:
    """Encoder DP replica i feeds language replicas [i*k, (i+1)*k): same samples, same order."""
    def per_rank(module):
        ranks = {}
        for result in filter(None, results):
            if result["module"] == module and result["tp_rank"] == 0 and result["pp_rank"] == 0:
                ranks[result["dp_rank"]] = {r["step"]: r["sample_ids"] for r in result["records"]}
        return ranks

    encoder_ranks, language_ranks = per_rank(encoder), per_rank(language)
    k = len(language_ranks) // len(encoder_ranks)
    for i, steps in encoder_ranks.items():
        for step, ids in steps.items():
            fed = [sid for j in range(i * k, (i + 1) * k) for sid in language_ranks[j][step]]
            assert ids == fed, f"step {step}: encoder replica {i} does not feed language replicas {i * k}..{(i + 1) * k - 1}"


def vision_spread(results: list[dict | None], module: str) -> float:
    """Mean over steps of (heaviest - lightest) per-rank image tokens in one module."""
    loads: dict[int, dict[int, int]] = defaultdict(dict)
    for result in filter(None, results):
        if result["module"] == module and result["tp_rank"] == 0 and result["pp_rank"] == 0:
            for record in result["records"]:
                loads[record["step"]][result["dp_rank"]] = sum(record["image_tokens"])
    spreads = [max(v.values()) - min(v.values()) for v in loads.values()]
    return sum(spreads) / len(spreads)


def baseline_spread(dp_size: int, steps: int, *, micro_batch_size: int, seed: int, dataset_size: int = 4096) -> float:
    """The same figure without reordering: each rank keeps its contiguous canonical shard."""
    per_rank = micro_batch_size // dp_size
    spreads = []
    for step in range(steps):
        ids = global_microbatch_indices(step, dataset_size, micro_batch_size, seed, True)
        loads = [sum(image_tokens_for(int(i), seed) for i in ids[r * per_rank : (r + 1) * per_rank]) for r in range(dp_size)]
        spreads.append(max(loads) - min(loads))
    return sum(spreads) / len(spreads)
