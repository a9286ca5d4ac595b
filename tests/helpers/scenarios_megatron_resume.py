"""Scenarios run on every rank of a Gloo pool: a graph restarted from a Megatron checkpoint's
``consumed_train_samples``, or from the pipeline state saved inside its iteration folders (saves that failed or
were never committed among them), continues the stream of the uninterrupted run."""

from __future__ import annotations

from scenarios_exchange import PAD_VALUES, join_layout, make_config
from scenarios_resume import fingerprint

from mimo_pipes.errors import ConfigError
from mimo_pipes.megatron import microbatches_from_samples, samples_from_microbatches
from mimo_pipes.parallel.topology import build_topology
from mimo_pipes.testing import IMAGE_TOKEN_ID, SyntheticProcessedDataset
from mimo_pipes_recipes.vlm_sft import pipeline


def restart_from_consumed_samples(components, *, microbatches_per_iteration, iterations, stop_after, micro_batch_size, window_size, seed):
    """Megatron's loop: each iteration takes ``microbatches_per_iteration`` micro-batches and adds its global
    batch to ``consumed_train_samples``. Stop after ``stop_after`` iterations, map the count, rebuild, and
    compare the rest with the uninterrupted stream."""
    joined = join_layout(components, timeout_s=60)
    if joined is None:
        return None
    topology, groups, layout = joined
    global_batch = micro_batch_size * microbatches_per_iteration
    config = make_config(components, micro_batch_size=micro_batch_size, window_size=window_size, global_batch_size=global_batch, seed=seed)
    config.validate(world_size=topology.world_size)

    def loader(consumed=0):
        return pipeline(SyntheticProcessedDataset(400, seed=seed), config, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID,
                        pad_values=PAD_VALUES, consumed_microbatches=consumed)

    def take(graph, count):
        try:
            return [fingerprint(next(graph)) for _ in range(count)]
        finally:
            graph.close()

    total = iterations * microbatches_per_iteration
    reference = take(loader(), total)
    consumed_train_samples = 0
    first = loader()
    for _ in range(stop_after):
        [next(first) for _ in range(microbatches_per_iteration)]
        consumed_train_samples += global_batch  # what Megatron's checkpoint keeps
    first.close()
    language_dp = topology.language.dp  # Megatron's data-parallel size; its --micro-batch-size is per DP rank
    megatron = {"global_batch_size": global_batch, "micro_batch_size": micro_batch_size // language_dp, "data_parallel_size": language_dp}
    consumed = microbatches_from_samples(consumed_train_samples=consumed_train_samples, **megatron)
    restarted = loader(consumed)
    num_yielded_at_start = restarted.consumed_microbatches
    rest = take(restarted, total - consumed)
    return {
        "module": groups.position.module.name,
        "consumed": consumed,
        "num_yielded_at_start": num_yielded_at_start,
        "continues": rest == reference[consumed:],
        "back_to_samples": samples_from_microbatches(consumed_microbatches=consumed, **megatron) == consumed_train_samples,
        "steps": [step for step, _, _ in rest],
    }


def resume_from_iteration_folders(components, resume_components, *, directory, microbatches_per_iteration, iterations, save_at,
                                  micro_batch_size, window_size, seed, failing_rank):
    """Megatron's loop on ``components``, saving the pipeline's state into its iteration folders: iteration
    ``save_at`` saved and committed (the tracker); iteration ``save_at + 1``'s save fails on ``failing_rank``
    (its write refused, as a full disk would); iteration ``save_at + 2``'s pipeline state is written but the job
    dies before Megatron commits it. Then every rank of ``resume_components`` (the same modules, any layout)
    loads the state of the iteration Megatron resumes from and continues; compared with the uninterrupted run
    of that layout."""
    from mimo_pipes.exchange.world import barrier, job_group, world_rank
    from mimo_pipes.megatron import checkpoint as megatron_checkpoint

    def run_on(layout_components):
        joined = join_layout(layout_components, timeout_s=60)
        group = job_group(build_topology(layout_components).world_size)  # collective over the world, spare ranks too
        return joined, group

    joined, group = run_on(components)
    outcome = {}
    if joined is not None:
        topology, _, layout = joined
        settings = make_config(components, micro_batch_size=micro_batch_size, window_size=window_size,
                               global_batch_size=micro_batch_size * microbatches_per_iteration, seed=seed)
        megatron = {"global_batch_size": micro_batch_size * microbatches_per_iteration,
                    "micro_batch_size": micro_batch_size // topology.language.dp, "data_parallel_size": topology.language.dp}
        graph = _loader(settings, layout, seed)
        consumed_train_samples, refusals = 0, []
        try:
            for iteration in range(1, save_at + 3):
                [next(graph) for _ in range(microbatches_per_iteration)]
                consumed_train_samples += megatron["global_batch_size"]
                if iteration < save_at:
                    continue
                consumed = microbatches_from_samples(consumed_train_samples=consumed_train_samples, **megatron)
                real = megatron_checkpoint.write_rank_files
                if iteration == save_at + 1 and world_rank() == failing_rank:
                    megatron_checkpoint.write_rank_files = _refused_write
                try:
                    megatron_checkpoint.save_pipeline_state(directory, iteration, graph.state_dict(), config=settings,
                                                            consumed_microbatches=consumed, group=group)
                except ConfigError as error:
                    refusals.append(str(error))
                finally:
                    megatron_checkpoint.write_rank_files = real
                if iteration == save_at and world_rank() == 0:
                    megatron_checkpoint.commit_iteration(directory, iteration)  # after the folder, as Megatron does
        finally:
            graph.close()
        outcome["refusals"] = refusals
    barrier()  # the job restarts once every rank is past the saves (spare ranks too): the tracker names iteration save_at
    joined, _ = run_on(resume_components)
    if joined is None:
        return None
    topology, groups, layout = joined
    settings = make_config(resume_components, micro_batch_size=micro_batch_size, window_size=window_size,
                           global_batch_size=micro_batch_size * microbatches_per_iteration, seed=seed)
    consumed = save_at * microbatches_per_iteration
    state = megatron_checkpoint.load_pipeline_state(directory, config=settings, consumed_microbatches=consumed)
    total = iterations * microbatches_per_iteration
    expected = _taken(_loader(settings, layout, seed), total)[consumed:]  # closed before the next graph's exchange starts
    restored = _loader(settings, layout, seed)
    restored.load_state_dict(state)
    rest = _taken(restored, total - consumed)
    return {**outcome, "module": groups.position.module.name, "latest": megatron_checkpoint.latest_iteration(directory),
            "continues": rest == expected, "steps": [step for step, _, _ in rest]}


def _loader(settings, layout, seed):
    return pipeline(SyntheticProcessedDataset(400, seed=seed), settings, layout, map_fn=None, image_token_id=IMAGE_TOKEN_ID,
                    pad_values=PAD_VALUES)


def _taken(graph, count):
    try:
        return [fingerprint(next(graph)) for _ in range(count)]
    finally:
        graph.close()


def _refused_write(directory, generation, files):
    raise OSError(28, "No space left on device", str(directory))
