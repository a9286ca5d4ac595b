"""Exact numbers: cost weights at a stated precision, costs inside the planners' int64 range on every path
(the graph's CostAnnotator and planner, analyze's replay, ``mimo-pipes balance``), refused cleanly with
the flag named when they would not fit."""

from __future__ import annotations

import io
import json
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchdata.nodes import IterableWrapper

from mimo_pipes.analysis.analyze import analyze
from mimo_pipes.balance import balance_window
from mimo_pipes.balance.validate import MAX_TOTAL_COST
from mimo_pipes.cli.commands.balance_cmd import serve
from mimo_pipes.cli.main import main
from mimo_pipes.config import PipelineConfig, ReorderConfig, exact_weight
from mimo_pipes.config.tail_settings import resolve_plan, resolve_tail
from mimo_pipes.errors import ConfigError
from mimo_pipes.nodes import CostAnnotator
from mimo_pipes.samples.sample import COST, ENCODER_COST
from mimo_pipes.time_model.model import TimeModel, save_time_model

REORDER = ["--scalable-dp", "--intra-microbatch-reorder"]
IMAGE = 9
INT64_MAX = 2**63 - 1


# ----------------------------------------------------------------------------------------------------
# Weights at a stated precision


@pytest.mark.parametrize("value, exact", [("0.3", Fraction(3, 10)), (0.3, Fraction(3, 10)), ("0.000125", Fraction(1, 8000)),
                                          ("2.500000", Fraction(5, 2)), ("1/3", Fraction(1, 3)), (Fraction(3, 7), Fraction(3, 7)),
                                          ("1e-6", Fraction(1, 10**6)), (4, Fraction(4))])
def test_a_weight_is_read_exactly_at_six_decimal_places(value, exact):
    assert exact_weight(value, "--w") == exact


@pytest.mark.parametrize("value, hint", [("0.30000000000000004", "0.3"), (0.1 + 0.2, "0.3"), ("1e-7", "0"),
                                         ("0.1234567", "0.123457"), ("1/1000001", "0.000001")])
def test_a_weight_finer_than_six_decimal_places_is_refused_with_its_rounding(value, hint):
    with pytest.raises(ConfigError, match=rf"^--w: {value}: weights are read exactly with at most 6 decimal places "
                                          rf"\(or as p/q with q <= 1000000\); did you mean {hint}\?$"):
        exact_weight(value, "--w")


def test_float_noise_in_a_weight_is_refused_by_run_naming_the_flag(capsys):
    assert main(["run", *REORDER, "--reorder-language-cost-weight", "0.30000000000000004"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mimo-pipes run: error: --reorder-language-cost-weight: 0.30000000000000004: weights are read exactly with "
                   "at most 6 decimal places (or as p/q with q <= 1000000); did you mean 0.3?"]


# ----------------------------------------------------------------------------------------------------
# Costs inside the planners' range, checked before anything runs


def test_a_weight_whose_costs_leave_int64_is_refused_before_the_run(capsys):
    assert main(["run", *REORDER, "--reorder-language-cost-weight", "1000000000000000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mimo-pipes run: error: --reorder-language-cost-weight: "), err
    assert "int64" in err[0] and "--seq-length 2048" in err[0]


def test_a_time_model_term_beyond_int64_is_refused_naming_the_field(tmp_path, capsys):
    path = tmp_path / "model.json"
    body = TimeModel(per_patch_ps=1).terms() | {"per_patch_ps": 10**30}
    path.write_text(json.dumps(body))
    assert main(["run", *REORDER, "--reorder-cost-model", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mimo-pipes run: error: --reorder-cost-model: time model {path}: per_patch_ps: "), err
    assert "int64" in err[0]


def test_time_model_terms_whose_sample_costs_leave_int64_are_refused(tmp_path, capsys):
    path = save_time_model(TimeModel(per_patch_squared_ps=10**15), tmp_path / "model.json")  # fine alone, not for 2048 tokens
    config = PipelineConfig(reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_cost_model=str(path)))
    with pytest.raises(ConfigError, match=r"^reorder_cost_model: .*int64") as info:  # Python: the fields' names
        config.validate()
    assert "seq_length 2048" in str(info.value)
    config.seq_length = 64
    config.validate()


def test_a_sample_too_costly_for_the_window_is_refused_by_the_cost_annotator():
    """Without a sequence length (balance_iterator unpadded) the bound is checked sample by sample."""
    reorder = ReorderConfig(reorder_language_cost_weight="100000000000000")
    settings_ = resolve_tail(reorder, micro_batch_size=8, dp_size=1, grid_size=1, image_token_ids=IMAGE, pad_length=None, pad_values={})
    short, long = (torch.ones(n, dtype=torch.int64) for n in (100, 20000))
    node = CostAnnotator(IterableWrapper([{"sample_id": k, "step": k, "input_ids": ids, "attention_mask": ids} for k, ids in enumerate((short, long))]),
                         settings=settings_)
    node.reset()
    assert next(node)[COST] == 100 * 100000000000000 + 0
    with pytest.raises(ConfigError, match=r"^reorder_language_cost_weight: sample 1 costs 2000000000000000000, more than "
                                          r"\d+ \(the int64 range of the planners over a window of 8 samples\)"):
        next(node)


# ----------------------------------------------------------------------------------------------------
# Property: extreme values on every path are refused cleanly or computed exactly

big = st.one_of(st.integers(0, 10), st.integers(0, 2**20), st.integers(0, 2**40), st.integers(0, 2**64), st.sampled_from([2**62 - 1, 2**62, 2**63 - 1, 2**63]))
weights = st.one_of(st.sampled_from(["0", "1", "0.5", "0.000001", "999999.999999", "0.30000000000000004"]),
                    st.decimals(0, 10**15, places=6, allow_nan=False, allow_infinity=False).map(str),
                    st.integers(0, 2**70).map(str))


@st.composite
def time_models(draw):
    if draw(st.booleans()):
        return None
    terms = {name: draw(big) for name in ("floor_ps", "per_image_ps", "per_patch_ps", "per_patch_squared_ps")}
    terms["per_patch_ps"] = max(terms["per_patch_ps"], 1)
    return terms


def _reorder(encoder, language, packed, crossover, model, tmp_path):
    path = None
    if model is not None:
        path = tmp_path / "model.json"
        path.write_text(json.dumps(TimeModel(per_patch_ps=1).terms() | model))
    return ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_encoder_cost_weight=encoder,
                         reorder_language_cost_weight=language, reorder_language_cost="packed" if packed else "tokens",
                         reorder_attention_crossover=crossover, reorder_cost_model=None if path is None else str(path))


def _exact_cost(cost, image_runs, real):
    encoder = sum(image_runs) if cost.time_model is None else cost.time_model.encoder_time_ns(image_runs)
    return encoder, cost.encoder_weight * encoder + cost.language_weight * real + cost.language_square_weight * real * real


def _check_plan(plan, costs, slots, floor=0):
    """A plan over the (W, B) window is a partition into equal slots, and (exact arithmetic) no worse than
    the window as it stands."""
    count, size = len(costs), len(costs[0])
    flat = [c for row in costs for c in row]
    assert sorted(i for micro in plan for slot in micro for i in slot) == list(range(count * size))
    assert all(len(slot) == size // slots for micro in plan for slot in micro)
    path = sum(max(floor, max(sum(flat[i] for i in slot) for slot in micro)) for micro in plan)
    still = sum(max(floor, max(sum(row[s * size // slots:(s + 1) * size // slots]) for s in range(slots))) for row in costs)
    assert path <= still


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(encoder=weights, language=weights, packed=st.booleans(), crossover=st.integers(1, 2**40), model=time_models(),
       seq_length=st.integers(1, 4096), batch=st.sampled_from([1, 2, 4, 8]), window=st.integers(1, 4), data=st.data())
def test_the_graph_refuses_or_prices_exactly(tmp_path, encoder, language, packed, crossover, model, seq_length, batch, window, data):
    reorder = _reorder(encoder, language, packed, crossover, model, tmp_path)
    reorder.reorder_window_size = window
    config = PipelineConfig(seq_length=seq_length, micro_batch_size=batch, reorder=reorder,
                            components=("language=dp=1", "images=dp=1,rank_offset=1"))
    try:
        topology = config.validate()
        settings_ = resolve_tail(reorder, micro_batch_size=batch, dp_size=1, grid_size=1, image_token_ids=IMAGE,
                                 pad_length=seq_length, pad_values={}, topology=topology)
    except ConfigError:
        return
    samples = []
    for k in range(window * batch):
        length = data.draw(st.integers(1, seq_length))
        images = data.draw(st.integers(0, length))
        ids = torch.cat([torch.full((images,), IMAGE), torch.ones(length - images, dtype=torch.int64)])
        samples.append({"sample_id": k, "step": k // batch, "input_ids": ids, "attention_mask": torch.ones(length, dtype=torch.int64)})
    node = CostAnnotator(IterableWrapper(samples), settings=settings_)
    node.reset()
    costs = []
    for sample in samples:
        out = next(node)
        runs = [int((sample["input_ids"] == IMAGE).sum())]
        encoder_cost, cost = _exact_cost(settings_.plan.cost, [r for r in runs if r], int(sample["attention_mask"].sum()))
        assert (out[ENCODER_COST], out[COST]) == (encoder_cost, cost)
        costs.append(cost)
    floor = settings_.plan.planner.floor
    assert window * floor + sum(costs) <= MAX_TOTAL_COST
    rows = [costs[m * batch:(m + 1) * batch] for m in range(window)]
    tensor = torch.tensor(rows, dtype=torch.int64)  # what the exchange packs: never "Overflow when unpacking long long"
    assert tensor.tolist() == rows
    _check_plan(balance_window(rows, 1, across_microbatches=True, floor=floor), rows, 1, floor)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # a whole analyze each
@given(encoder=weights, language=weights, packed=st.booleans(), model=time_models(), seq_length=st.integers(1, 4096),
       data=st.data())
def test_analyze_refuses_or_replays_exactly(tmp_path, encoder, language, packed, model, seq_length, data):
    reorder = _reorder(encoder, language, packed, 49152, model, tmp_path)
    config = PipelineConfig(seq_length=seq_length, micro_batch_size=4, reorder=reorder, dataloader_type="single")
    rows = 16
    real = np.array(data.draw(st.lists(st.integers(0, seq_length), min_size=rows, max_size=rows)), dtype=np.int64)
    image = np.minimum(np.array(data.draw(st.lists(st.integers(0, seq_length), min_size=rows, max_size=rows)), dtype=np.int64), real)
    try:
        topology = config.validate()
        model_ = reorder.load_time_model()
        encoder_costs = None if model_ is None else np.array([model_.encoder_time_ns([n] if n else []) for n in image.tolist()], dtype=np.int64)
        result = analyze(config, topology, image, real, start=0, stop=4, encoder_costs=encoder_costs, compare_window_sizes=(2, 4))
    except ConfigError:
        return
    for figures in result.figures.values():
        assert figures["critical_path_after"] >= 0 and figures["critical_path_before"] >= 0
    # The costs the replay planned on (the plan's own arithmetic on the count arrays) are the exact ones.
    cost = resolve_plan(reorder, topology).cost
    planned = cost.cost(image if encoder_costs is None else encoder_costs, real)
    exact = [_exact_cost(cost, [n] if n else [], r)[1] for n, r in zip(image.tolist(), real.tolist())]
    assert planned.tolist() == exact


def test_analyze_refuses_costs_beyond_int64_instead_of_wrapping():
    """Counts past what --seq-length allows (a recipe of one's own) still cannot wrap around."""
    config = PipelineConfig(micro_batch_size=4, dataloader_type="single", seq_length=2048,
                            reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_language_cost_weight="1000000"))
    topology = config.validate()
    real = np.full(16, 2**50, dtype=np.int64)
    with pytest.raises(ConfigError, match="^reorder_language_cost_weight: .*int64"):
        analyze(config, topology, np.zeros(16, dtype=np.int64), real, start=0, stop=4)


lines = st.lists(st.one_of(big, st.integers(-5, -1)), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(costs=st.one_of(lines, st.lists(lines, min_size=1, max_size=3)), slots=st.sampled_from([1, 2, 4]), across=st.booleans())
def test_balance_answers_exactly_or_refuses_the_line(costs, slots, across):
    nested = isinstance(costs[0], list)
    if nested:  # micro-batches of one size, divisible by the slots
        size = slots * max(1, len(costs[0]) // slots)
        costs = [(row * size)[:size] for row in costs]
    else:
        costs = (costs * slots)[: slots * max(1, len(costs) // slots)]
    request = {"costs": costs, "slots": slots, **({"across_microbatches": True} if nested and across else {})}
    out, err = io.StringIO(), io.StringIO()
    status = serve(io.BytesIO((json.dumps(request) + "\n").encode()), out, err)
    if status:
        assert status == 2 and err.getvalue().startswith("mimo-pipes balance: line 1: ") and err.getvalue().count("\n") == 1
        assert "Overflow" not in err.getvalue()
        assert any(c < 0 for c in np.ravel(costs).tolist()) or sum(np.ravel(np.array(costs, dtype=object)).tolist()) > MAX_TOTAL_COST
        return
    answer = json.loads(out.getvalue())
    window = costs if nested else [costs]
    plan = answer["microbatches"] if nested else [answer["slots"]]
    _check_plan(plan, window, slots)


@settings(max_examples=100, deadline=None)
@given(costs=st.lists(st.lists(big, min_size=2, max_size=2), min_size=1, max_size=4), floor=big)
def test_the_window_planner_refuses_or_plans_exactly_with_any_floor(costs, floor):
    try:
        plan = balance_window(costs, 2, across_microbatches=True, floor=floor)
    except ValueError as error:
        assert "too large" in str(error)
        assert len(costs) * floor + sum(map(sum, costs)) > MAX_TOTAL_COST
        return
    assert len(costs) * floor + sum(map(sum, costs)) <= MAX_TOTAL_COST  # every critical path it compared is exact
    _check_plan(plan, costs, 2, floor)


def test_analyze_refuses_modelled_times_beyond_int64(tmp_path):
    model = save_time_model(TimeModel(per_patch_ps=1), tmp_path / "model.json")
    config = PipelineConfig(micro_batch_size=4, dataloader_type="single",
                            reorder=ReorderConfig(scalable_dp=True, intra_microbatch_reorder=True, reorder_cost_model=str(model)))
    topology = config.validate()
    times = np.array([2**70] * 16, dtype=object)  # what RowCounts.encoder_costs gives for times past int64
    with pytest.raises(ConfigError, match=r"^reorder_cost_model: sample 0 costs 1180591620717411303424, more than"):
        analyze(config, topology, np.ones(16, dtype=np.int64), np.ones(16, dtype=np.int64), start=0, stop=4, encoder_costs=times)
