"""The time model: placeholder runs, integer terms, the JSON file, the fit, and the planners using it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.balance import balance_microbatch, balance_two_level, balance_window
from mimo_pipes.config import ReorderConfig
from mimo_pipes.config.planner import planner_settings
from mimo_pipes.errors import ConfigError
from mimo_pipes.parallel.topology import build_topology
from mimo_pipes.samples.cost import placeholder_runs
from mimo_pipes.testing import tail_settings
from mimo_pipes.time_model import TimeModel, TimeModelError, fit_time_model, load_time_model, save_time_model
from mimo_pipes.time_model.fit import fit_error, relative_errors

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from window_exact import exact_window_path  # noqa: E402 - benchmarks folder put on the path just above

IMAGE, VIDEO, START, END, TEXT = 90, 91, 80, 81, 7
MODEL = TimeModel(floor_ps=20_000_000_000, per_image_ps=1_000_000_000, per_patch_ps=5_500_000, per_patch_squared_ps=400)


def test_runs_text_only_single_multi_image_video_and_truncated():
    assert placeholder_runs([TEXT, TEXT, TEXT], (IMAGE, VIDEO)) == []
    single = [TEXT, START, *[IMAGE] * 5, END, TEXT]
    assert placeholder_runs(single, IMAGE) == [5]
    multi = [START, *[IMAGE] * 3, END, START, *[IMAGE] * 7, END, TEXT, START, IMAGE, END]
    assert placeholder_runs(torch.tensor(multi), IMAGE) == [3, 7, 1]
    video = [START, *[IMAGE] * 4, END, START, *[VIDEO] * 12, END]
    assert placeholder_runs(np.asarray(video), (IMAGE, VIDEO)) == [4, 12]
    assert placeholder_runs(video, IMAGE) == [4]  # video placeholders are not images
    touching = [*[IMAGE] * 2, *[VIDEO] * 3]  # different placeholders never merge into one run
    assert placeholder_runs(touching, (IMAGE, VIDEO)) == [2, 3]
    truncated = [TEXT, START, *[IMAGE] * 4, END, START, *[IMAGE] * 6]  # the second run is cut at the end
    assert placeholder_runs(truncated, IMAGE) == [4, 6]


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from([IMAGE, VIDEO, TEXT]), st.integers(1, 5)), max_size=12))
def test_runs_match_a_plain_scan(pieces):
    ids = [token for token, count in pieces for _ in range(count)]
    expected, previous = [], None
    for token in ids:
        if token in (IMAGE, VIDEO):
            if token == previous:
                expected[-1] += 1
            else:
                expected.append(1)
        previous = token
    assert placeholder_runs(ids, (IMAGE, VIDEO)) == expected
    assert sum(placeholder_runs(ids, (IMAGE, VIDEO))) == sum(1 for t in ids if t in (IMAGE, VIDEO))


def test_integer_time_terms_and_floor():
    merge = MODEL.merge_size**2
    patches = 256 * merge
    expected = (1_000_000_000 + 5_500_000 * patches + 400 * patches * patches) // 1000
    assert MODEL.encoder_time_ns([256]) == expected
    assert MODEL.encoder_time_ns([256, 256]) == 2 * expected
    assert MODEL.encoder_time_ns([]) == 0
    assert MODEL.forward_time_ns([1]) == MODEL.floor_ns == 20_000_000  # a near-empty forward pays the floor
    assert MODEL.forward_time_ns([2000]) == MODEL.encoder_time_ns([2000]) > MODEL.floor_ns
    # one large image costs more than the same patches in small images (attention is within an image)
    assert MODEL.encoder_time_ns([1024]) > MODEL.encoder_time_ns([256] * 4) - 3 * 1_000_000


def test_json_round_trip_and_fingerprint(tmp_path):
    path = save_time_model(MODEL, tmp_path / "model.json", calibration={"tower": "tiny", "points": []})
    loaded = load_time_model(path)
    assert loaded == MODEL
    assert loaded.fingerprint() == MODEL.fingerprint()
    # notes about the measurement do not change the model; any term does
    save_time_model(MODEL, tmp_path / "other.json", calibration={"tower": "another"})
    assert load_time_model(tmp_path / "other.json").fingerprint() == MODEL.fingerprint()
    body = json.loads(path.read_text())
    body["per_patch_ps"] += 1
    (tmp_path / "changed.json").write_text(json.dumps(body))
    assert load_time_model(tmp_path / "changed.json").fingerprint() != MODEL.fingerprint()


def test_files_without_the_fit_error_or_any_calibration_still_load(tmp_path):
    """Files written before calibrate recorded its fit error, or with no calibration notes at all."""
    fit = {"worst": -0.41, "median": 0.03, "threshold": 0.5, "accepted_poor_fit": False}
    new = save_time_model(MODEL, tmp_path / "new.json", calibration={"tower": "tiny", "fit_error": fit, "points": []})
    older = save_time_model(MODEL, tmp_path / "older.json", calibration={"tower": "tiny", "points": []})
    bare = save_time_model(MODEL, tmp_path / "bare.json")
    assert "calibration" not in json.loads(bare.read_text())
    assert load_time_model(new) == load_time_model(older) == load_time_model(bare) == MODEL
    assert len({load_time_model(path).fingerprint() for path in (new, older, bare)}) == 1  # notes are not the model


@settings(deadline=None)
@given(st.lists(st.tuples(st.floats(1e-6, 10.0), st.floats(0.0, 10.0)), min_size=1, max_size=40))
def test_fit_error_is_the_largest_and_median_relative_error(pairs):
    measured, modelled = [m for m, _ in pairs], [f for _, f in pairs]
    error = fit_error(measured, modelled)
    errors = relative_errors(measured, modelled)
    assert error.worst == errors[error.worst_index] and all(abs(e) <= abs(error.worst) for e in errors)
    assert 0 <= error.median <= abs(error.worst)
    sizes = [abs(e) for e in errors]  # the median: at least half the sizes on either side of it
    assert 2 * sum(size <= error.median for size in sizes) >= len(sizes) and 2 * sum(size >= error.median for size in sizes) >= len(sizes)
    assert error.is_poor(threshold=abs(error.worst) / 2) or error.worst == 0
    assert not error.is_poor(threshold=abs(error.worst))
    assert fit_error(measured, measured).worst == 0  # a model that matches every point


@pytest.mark.parametrize(
    "change, field",
    [
        ({"format": "something-else"}, "format"),
        ({"version": 99}, "version"),
        ({"per_patch_ps": -5}, "per_patch_ps"),
        ({"floor_ps": 1.5}, "floor_ps"),
        ({"merge_size": 0}, "merge_size"),
        ({"colour": 1}, "colour"),
        ({"per_image_ps": 0, "per_patch_ps": 0, "per_patch_squared_ps": 0}, "per_patch_ps"),
    ],
)
def test_bad_files_are_refused_naming_file_and_field(tmp_path, change, field):
    body = {**json.loads(save_time_model(MODEL, tmp_path / "good.json").read_text()), **change}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(body))
    with pytest.raises(TimeModelError, match=rf"{path}.*{field}"):
        load_time_model(path)
    with pytest.raises(ConfigError, match=r"reorder_cost_model.*bad.json"):
        ReorderConfig(reorder_cost_model=str(path)).validate()


def test_missing_field_unreadable_and_not_json(tmp_path):
    body = json.loads(save_time_model(MODEL, tmp_path / "good.json").read_text())
    del body["floor_ps"]
    (tmp_path / "missing.json").write_text(json.dumps(body))
    with pytest.raises(TimeModelError, match="floor_ps: missing"):
        load_time_model(tmp_path / "missing.json")
    (tmp_path / "text.json").write_text("not json")
    with pytest.raises(TimeModelError, match="is not JSON"):
        load_time_model(tmp_path / "text.json")
    with pytest.raises(TimeModelError, match="cannot be read"):
        load_time_model(tmp_path / "absent.json")


def test_geometry_mismatch_with_the_processor_is_refused():
    MODEL.check_geometry("m.json", merge_size=2, patch_size=14, temporal_patch_size=2)
    with pytest.raises(TimeModelError, match="m.json: patch_size: 14 in the file, but the processor uses 16"):
        MODEL.check_geometry("m.json", merge_size=2, patch_size=16)


def _synthetic_points(model: TimeModel, noise: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    points = []
    for side in (8, 16, 32, 48, 64, 96, 128):
        for count in (1, 4, 16):
            patches = [side * side] * count
            seconds = max(model.floor_ps, sum(model.image_time_ps(p) for p in patches)) / 1e12
            points.append((patches, seconds * (1 + noise * rng.standard_normal())))
    return points


@pytest.mark.parametrize("noise", [0.0, 0.01])
def test_fit_recovers_known_terms(noise):
    truth = TimeModel(floor_ps=20_000_000_000, per_image_ps=900_000_000, per_patch_ps=5_000_000, per_patch_squared_ps=300)
    model, fitted = fit_time_model(_synthetic_points(truth, noise), truth.floor_ps / 1e12, merge_size=2, patch_size=14, temporal_patch_size=2)
    tolerance = 1e-3 if noise == 0 else 0.1
    for name in ("per_image_ps", "per_patch_ps", "per_patch_squared_ps"):
        assert abs(getattr(model, name) - getattr(truth, name)) <= tolerance * getattr(truth, name), name
    assert len(fitted) == 21 and min(fitted) >= truth.floor_ps / 1e12 - 1e-12


def test_fit_keeps_terms_non_negative():
    # times that fall with size would need a negative term: the fit drops it instead
    points = [([100], 0.010), ([400], 0.009), ([900], 0.012), ([1600], 0.020)]
    model, _ = fit_time_model(points, 0.001)
    assert min(model.per_image_ps, model.per_patch_ps, model.per_patch_squared_ps) >= 0


def test_cost_annotator_uses_the_model():
    from torchdata.nodes import IterableWrapper

    from mimo_pipes.nodes import CostAnnotator
    from mimo_pipes.samples.sample import COST, ENCODER_COST

    ids = torch.tensor([TEXT, START, *[IMAGE] * 30, END, START, *[IMAGE] * 6, END, TEXT])
    sample = {"sample_id": 0, "step": 0, "input_ids": ids, "attention_mask": torch.ones(len(ids), dtype=torch.int64)}
    settings = tail_settings(samples_per_rank=1, image_token_id=IMAGE, encoder_weight=3, language_weight=1, time_model=MODEL)
    node = CostAnnotator(IterableWrapper([sample]), settings=settings)
    out = next(iter(node))
    assert out[ENCODER_COST] == MODEL.encoder_time_ns([30, 6])
    assert out[COST] == 3 * MODEL.encoder_time_ns([30, 6]) + len(ids)


def test_planner_settings_from_the_component_specs():
    topology = build_topology(["language=dp=4", "images=dp=2,rank_offset=4"])
    reorder = ReorderConfig(intra_microbatch_reorder=True, scalable_dp=True, reorder_encoder_cost_weight=2,
                             reorder_language_cost_weight=1)
    one = planner_settings(topology, reorder, MODEL)
    assert (one.floor, one.encoder_groups) == (2 * MODEL.floor_ns // 2, 0)  # two slots per encoder forward
    two = planner_settings(topology, ReorderConfig(reorder_two_level=True), MODEL)
    assert (two.floor, two.encoder_groups) == (MODEL.floor_ns, 2)
    assert planner_settings(topology, reorder, None).floor == 0
    with pytest.raises(ConfigError, match="^reorder_two_level: "):
        planner_settings(build_topology(["language=dp=2", "images=dp=2,rank_offset=2"]), ReorderConfig(reorder_two_level=True), MODEL)


def _floored_path(rows, plan, floor):
    flat = [c for row in rows for c in row]
    return sum(max(floor, max(sum(flat[i] for i in slot) for slot in slots)) for slots in plan)


def test_microbatch_below_the_floor_does_not_move():
    costs = [50, 40, 1, 2, 30, 20, 3, 4]
    assert balance_microbatch(costs, 4) != [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert balance_microbatch(costs, 4, floor=100) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert balance_microbatch(costs, 4, floor=60) != [[0, 1], [2, 3], [4, 5], [6, 7]]  # 90 is above it
    with pytest.raises(ValueError, match="floor must be an integer >= 0"):
        balance_microbatch(costs, 4, floor=-1)


def test_across_window_counts_the_floor_per_forward():
    # Without a floor, grouping the light samples into their own micro-batch looks free; with a floor
    # each forward costs at least the floor, and the plan must be judged by that.
    rows = [[900, 10, 800, 12], [20, 700, 15, 600]]
    for floor in (0, 500, 1000):
        plan = balance_window(rows, 2, across_microbatches=True, floor=floor)
        assert _floored_path(rows, plan, floor) == exact_window_path(rows, 2, floor)


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 4), st.sampled_from([(1, 2), (2, 2), (2, 3), (4, 2), (3, 1)]),
    st.data(), st.integers(0, 3000),
)
def test_across_window_conserves_and_beats_the_baselines(count, shape, data, floor):
    slots, per_slot = shape
    size = slots * per_slot
    rows = [data.draw(st.lists(st.integers(0, 2000), min_size=size, max_size=size)) for _ in range(count)]
    plan = balance_window(rows, slots, across_microbatches=True, floor=floor)
    flat_indices = sorted(i for slots_ in plan for slot in slots_ for i in slot)
    assert flat_indices == list(range(count * size))
    assert all(len(slot) == per_slot for slots_ in plan for slot in slots_)
    path = _floored_path(rows, plan, floor)
    still = [[list(range(m * size + s * per_slot, m * size + (s + 1) * per_slot)) for s in range(slots)] for m in range(count)]
    each = [[[m * size + i for i in slot] for slot in balance_microbatch(row, slots)] for m, row in enumerate(rows)]
    assert path <= _floored_path(rows, still, floor)
    assert path <= _floored_path(rows, each, floor) or count == 1


def test_across_window_is_close_to_exact_on_small_windows():
    rng = np.random.default_rng(5)
    ratios = []
    for trial in range(40):
        count, slots, per_slot = [(3, 2, 2), (2, 3, 2), (2, 2, 3), (6, 1, 2)][trial % 4]
        costs = rng.integers(0, 1500, count * slots * per_slot) * (rng.random(count * slots * per_slot) > 0.25)
        rows = costs.reshape(count, -1).tolist()
        floor = 0 if trial % 3 else int(costs.mean() * per_slot)
        best = exact_window_path(rows, slots, floor)
        ratios.append(_floored_path(rows, balance_window(rows, slots, True, floor=floor), floor) / max(best, 1))
    assert min(ratios) >= 1.0  # the exact reference is a true optimum
    assert np.mean(ratios) < 1.01 and max(ratios) < 1.06


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.sampled_from([(1, 2, 1), (2, 2, 1), (2, 2, 2), (1, 3, 2), (2, 4, 1)]), st.booleans(), st.data())
def test_two_level_pairs_groups_and_balances_each_level(count, shape, across, data):
    groups, k, per_slot = shape
    slots = groups * k
    size = slots * per_slot
    encoder = [data.draw(st.lists(st.integers(0, 5000), min_size=size, max_size=size)) for _ in range(count)]
    language = [data.draw(st.lists(st.integers(1, 300), min_size=size, max_size=size)) for _ in range(count)]
    plan = balance_two_level(encoder, language, groups, slots, across_microbatches=across)
    level_one = balance_window(encoder, groups, across_microbatches=across)
    assert len(plan) == count
    flat_language = [c for row in language for c in row]
    for slots_, groups_ in zip(plan, level_one):
        assert len(slots_) == slots and all(len(slot) == per_slot for slot in slots_)
        for g, group in enumerate(groups_):
            # encoder replica g feeds language slots [g*k, (g+1)*k): together they hold exactly its group
            fed = sorted(i for slot in slots_[g * k : (g + 1) * k] for i in slot)
            assert fed == group
            split = balance_microbatch([flat_language[i] for i in group], k)
            assert sorted(sum(flat_language[group[j]] for j in slot) for slot in split) == sorted(
                sum(flat_language[i] for i in slot) for slot in slots_[g * k : (g + 1) * k]
            )


def test_saved_state_remembers_the_model():
    from torchdata.nodes import IterableWrapper

    from mimo_pipes.nodes import CostAnnotator

    ids = torch.tensor([START, *[IMAGE] * 4, END])
    samples = [{"sample_id": k, "step": k, "input_ids": ids, "attention_mask": torch.ones(6, dtype=torch.int64)} for k in range(3)]

    def node(model):
        return CostAnnotator(IterableWrapper(samples), settings=tail_settings(samples_per_rank=1, image_token_id=IMAGE, time_model=model))

    first = node(MODEL)
    first.reset()
    next(first)
    state = first.get_state()
    assert state[CostAnnotator.VALID_FOR_KEY]["time model"] == MODEL.fingerprint()
    same = node(MODEL)
    same.reset(state)  # the same model: accepted
    assert next(same)["cost"] == MODEL.encoder_time_ns([4])
    with pytest.raises(ValueError, match=f"time model {MODEL.fingerprint()}, this graph has none"):
        node(None).reset(state)
    other = TimeModel(floor_ps=MODEL.floor_ps, per_image_ps=MODEL.per_image_ps + 1, per_patch_ps=MODEL.per_patch_ps)
    with pytest.raises(ValueError, match="time model"):
        node(other).reset(state)
