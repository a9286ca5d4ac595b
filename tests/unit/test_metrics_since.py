"""The running totals say what they count: ``cumulative/since_step``, the first step they count (0 from the
start of training, kept across a resume on the same layout; where the totals started again otherwise), and
the metrics line names it when it is not the start of training."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.observe.metrics import MetricsAccumulator, summary_line


def figures(first_step: int, microbatches: int = 2) -> dict:
    out = {"microbatches": microbatches, "first_step": first_step, "moved/samples": 1, "moved/bytes": 10.0, "time/exchange_s": 0.01,
           "rank/bytes_sent": 5, "rank/bytes_received": 5, "rank/samples_sent": 1, "rank/samples_received": 1}
    from mimo_pipes.observe.observer import PHASES

    out.update({f"time/{phase}_s": 0.001 for phase in PHASES})
    for quantity in ("image_tokens", "cost"):
        out[f"{quantity}/critical_path_lower_bound"] = 10
        for when in ("before", "after"):
            prefix = f"{quantity}/{when}"
            out.update({f"{prefix}/{name}": 3.0 for name in ("max", "min", "mean", "spread")})
            out[f"{prefix}/critical_path"] = 12
            out[f"{prefix}/per_rank"] = [6, 6]
    return out


@settings(max_examples=30, deadline=None)
@given(start=st.integers(0, 50).map(lambda n: 2 * n), windows=st.integers(1, 4), saved_after=st.integers(0, 4))
def test_since_is_the_first_counted_step_and_survives_a_resume(start, windows, saved_after):
    accumulator = MetricsAccumulator()
    metrics = None
    for w in range(windows):
        metrics = accumulator.add(figures(start + 2 * w), 0.0)
        if w + 1 == saved_after:
            restored = MetricsAccumulator()
            restored.load_state(json.loads(json.dumps(accumulator.state())))
            accumulator = restored
    assert metrics["cumulative/since_step"] == start and metrics["cumulative/windows"] == windows
    line = summary_line("language", metrics)
    assert (f"{windows} windows, {2 * windows} micro-batches since micro-batch {start}:" in line) == (start > 0)
    assert f"{windows} windows, {2 * windows} micro-batches" in line


def test_an_older_state_counts_from_the_start_of_training():
    accumulator = MetricsAccumulator()
    accumulator.add(figures(0), 0.0)
    state = accumulator.state()
    del state[MetricsAccumulator.SINCE_KEY]
    restored = MetricsAccumulator()
    restored.load_state(state)
    assert restored.add(figures(2), 0.0)["cumulative/since_step"] == 0
