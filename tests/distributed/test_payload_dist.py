"""Both payloads on real Gloo ranks (the warm pool): the same micro-batches on every rank, bitwise, far fewer
bytes moved with rows, exact resume; a row whose pixels cannot be decoded fails every rank of the module
that processes it; `run --summary-json`."""

from __future__ import annotations

import json

import pytest
from job_runs import run_in_pool, summary_lines
from scenarios_payload import consume_rows, consume_rows_failing_late, payload_streams

from mimo_pipes.data.embedded.builtin_dataset import default_dataset_path
from mimo_pipes.data.sources.open_source import open_source

LAYOUTS = {
    "dp2+2": ["language=dp=2", "images=dp=2,rank_offset=2"],
    "dp4+2": ["language=dp=4", "images=dp=2,rank_offset=4"],
}
SMALL = ["--embedded-samples", "48", "--micro-batch-size", "4", "--steps", "6", "--quiet", "--scalable-dp", "--intra-microbatch-reorder"]


@pytest.mark.parametrize(("layout", "window", "micro_batch_size"), [("dp2+2", 1, 4), ("dp4+2", 2, 8)])
def test_rows_and_samples_give_every_rank_the_same_micro_batches(gloo_pool, layout, window, micro_batch_size):
    results = [r for r in gloo_pool.run(payload_streams, LAYOUTS[layout], steps=6, window=window, stop_at=3,
                                        micro_batch_size=micro_batch_size) if r is not None]
    assert {r["module"] for r in results} == {"language", "images"}
    for result in results:
        where = f"{result['module']} dp rank {result['dp_rank']}"
        rows, samples = result["rows"], result["samples"]
        assert rows["prints"] == samples["prints"], f"{where}: the payloads' micro-batches differ"
        assert rows["resumed"] == rows["prints"][3:], f"{where}: resuming under rows differs"
        assert samples["resumed"] == samples["prints"][3:]
        assert rows["moved"][0] == samples["moved"][0] > 0  # the same samples move ...
        assert rows["moved"][1] * 20 < samples["moved"][1], where  # ... as far fewer bytes


def truncated_image_dataset(folder) -> tuple[str, int]:
    """The embedded rows with row 1's image cut short: its header reads, its pixels do not decode."""
    dataset = open_source(str(default_dataset_path(48, seed=0)))
    rows = [dict(dataset[i]) for i in range(len(dataset))]
    bad = next(i for i in range(len(rows)) if rows[i]["images"] and i >= 1)
    image = rows[bad]["images"][0]
    rows[bad]["images"] = [{"bytes": image["bytes"][: len(image["bytes"]) // 2], "path": None}] + rows[bad]["images"][1:]
    import datasets

    datasets.Dataset.from_list(rows, features=dataset.features).save_to_disk(str(folder))
    return str(folder), bad


def test_rows_resume_exactly_with_every_window_in_flight(gloo_pool):
    # 16 workers: RowProcessor holds 2 rows a worker ahead, more than the 8 steps' windows (2 rows each on a
    # rank): the whole stream is read and exchanged before the first window is handed out, and again on resume.
    for result in (r for r in gloo_pool.run(payload_streams, LAYOUTS["dp2+2"], steps=8, window=1, stop_at=3, workers=16) if r is not None):
        rows, samples = result["rows"], result["samples"]
        assert rows["prints"] == samples["prints"] and rows["resumed"] == rows["prints"][3:], result["module"]


# 8 workers: 9 windows of the 10 steps in flight at the first, the exchange's prefetch thread may agree on the end
# before the failing rank hands the bad row's window out (it tells its failure through abort, after the end);
# 16 workers: every window is in flight before the first is handed out, so the bad row fails after the module's
# last exchange: the agreement after the end still fails the encoder's peer.
@pytest.mark.parametrize("workers", [2, 8, 16])
def test_a_row_whose_pixels_do_not_decode_fails_every_rank_of_the_encoder_module(gloo_pool, tmp_path, workers):
    path, bad = truncated_image_dataset(tmp_path / "data")
    outcomes = gloo_pool.run_collect(consume_rows, LAYOUTS["dp2+2"], path, steps=10, workers=workers)
    language, images = outcomes[:2], outcomes[2:4]
    assert [status for status, _ in language] == ["ok", "ok"], language  # its fields need no pixel
    assert [status for status, _ in images] == ["error", "error"], images
    raised = {rank: value.split(": ", 1)[1] for rank, (_, value) in enumerate(images, start=2)}  # "rank r: <error>"
    failing = next(rank for rank, error in raised.items() if error.startswith(f"SampleError: sample {bad}, field 'images'"))
    peer = 5 - failing  # the other encoder rank (global ranks 2 and 3)
    assert raised[peer].startswith(f"PeerError: rank {failing} failed: SampleError: sample {bad}"), raised


def test_a_row_failing_after_its_ranks_exchange_thread_agreed_on_the_end_fails_every_encoder_rank(gloo_pool, tmp_path):
    path, bad = truncated_image_dataset(tmp_path / "data")
    outcomes = gloo_pool.run_collect(consume_rows_failing_late, LAYOUTS["dp2+2"], path, steps=4, bad=bad)
    images = outcomes[2:4]
    assert [status for status, _ in images] == ["error", "error"], images
    raised = {rank: value.split(": ", 1)[1] for rank, (_, value) in enumerate(images, start=2)}
    failing = next(rank for rank, error in raised.items() if error.startswith(f"SampleError: sample {bad}, field 'images'"))
    assert raised[5 - failing].startswith(f"PeerError: rank {failing} failed: SampleError: sample {bad}"), raised


def test_run_writes_the_summary_as_json(gloo_pool, tmp_path):
    documents = {}
    for payload in ("rows", "samples"):
        path = tmp_path / payload / "summary.json"
        outcome = run_in_pool(gloo_pool, [*SMALL, "--exchange-payload", payload, "--summary-json", str(path)])
        documents[payload] = json.loads(path.read_text())
        printed = summary_lines(outcome["stdout"])
        for module, figures in documents[payload]["modules"].items():
            columns = printed[module]
            assert [figures[key] for key in ("dp_size", "steps", "samples", "image_tokens")] == [int(c) for c in columns[1:5]]
            assert [round(figures[key], 1) for key in ("spread_before", "spread_after")] == [float(c) for c in columns[5:7]]
            assert [figures["critical_path_before"], figures["critical_path_after"]] == [int(c) for c in columns[7:9]]
            assert set(figures) == {"dp_size", "steps", "samples", "image_tokens", "spread_before", "spread_after",
                                    "critical_path_before", "critical_path_after", "moved_samples", "moved_bytes"}
    rows, samples = documents["rows"]["modules"], documents["samples"]["modules"]
    for module in rows:
        assert {k: v for k, v in rows[module].items() if k != "moved_bytes"} == {k: v for k, v in samples[module].items() if k != "moved_bytes"}
        assert 0 < rows[module]["moved_bytes"] * 20 < samples[module]["moved_bytes"]
