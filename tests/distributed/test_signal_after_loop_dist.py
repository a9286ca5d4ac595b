"""A SIGTERM that arrives after the last micro-batch, while rank 0 prints the summary (the pool's Gloo ranks,
through the body a job's ranks run): the summary is printed whole, then one line says the signal came and
which state is saved, and the rank stops for the signal."""

from __future__ import annotations

import signal

from scenarios_signals import run_signalled_in_summary

from mimo_pipes.checkpoint import open_generation

FLAGS = ["--micro-batch-size", "4", "--embedded-samples", "48", "--seed", "4", "--quiet", "--scalable-dp",
         "--intra-microbatch-reorder", "--reorder-window-size", "2", "--steps", "5"]


def test_sigterm_during_the_summary_prints_it_and_what_was_saved(gloo_pool, tmp_path):
    state = tmp_path / "state"
    outcomes = gloo_pool.run(run_signalled_in_summary, [*FLAGS, "--save-state", str(state)], timeout=300)
    first = outcomes[0]
    assert first["stop"] == (signal.SIGTERM, str(state))
    assert all(outcome["stop"] is None for outcome in outcomes[1:4])  # only rank 0 got the signal
    lines = first["stdout"].splitlines()
    assert [line.split()[0] for line in lines if line.split()[:1] in (["language"], ["images"])] == ["language", "images"]
    assert f"saved state after 5 micro-batches to {state}" in lines
    assert lines[-1] == f"SIGTERM came after the last micro-batch: the summary above is complete; the state after 5 micro-batches is saved in {state}"
    assert open_generation(state).consumed == 5
