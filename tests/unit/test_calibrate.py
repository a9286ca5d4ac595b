"""`mimo-pipes calibrate`: a CPU smoke run with the tiny tower, synthetic timings through the command (poor
fits refused or accepted, fit errors recorded), any callable from Python, the sweep, progress, and refusals."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_pipes.cli.commands import calibrate_cmd
from mimo_pipes.cli.main import build_parser, main
from mimo_pipes.config import ReorderConfig
from mimo_pipes.time_model.calibrate import calibrate, seconds_left, time_in_rounds
from mimo_pipes.time_model.fit import POOR_FIT_THRESHOLD, fit_error
from mimo_pipes.time_model.model import TimeModel, load_time_model
from mimo_pipes.time_model.sweep import SWEEPS, Sweep, forward_shapes, mixed_shapes, uniform_shapes

TRUTH = TimeModel(floor_ps=2_000_000_000, per_image_ps=300_000_000, per_patch_ps=8_000_000, per_patch_squared_ps=5_000)
SMALL = ["--sides", "4,8", "--images-per-forward", "1,2", "--mixes", "2", "--repeats", "1", "--warmup", "0"]


def synthetic_timer(seconds_of):
    """A timer in place of time_in_rounds: ``seconds_of(patches of each image)`` per forward, no forward run;
    it tells ``progress`` after every run as time_in_rounds does."""
    def timer(encoder, forwards, *, repeats, warmup, progress=None, **_):
        times = [seconds_of([t * h * w for t, h, w in forward]) for forward in forwards]
        total = len(forwards) * (warmup + repeats)
        for done in range(1, total + 1):
            if progress is not None:
                progress(done, total, (total - done) * 0.01)
        return times

    return timer


def true_seconds(patches):
    return max(TRUTH.floor_ps, sum(TRUTH.image_time_ps(p) for p in patches)) / 1e12


def upside_down_seconds(patches):
    return 0.05 / sum(patches)  # larger forwards faster: no non-negative model comes close


def run_calibrate(argv, timer):
    return calibrate_cmd.run(build_parser().parse_args(["calibrate", *argv]), timer=timer)


def test_cpu_smoke_run_with_the_tiny_tower_writes_a_loadable_model(tmp_path, capsys):
    out = tmp_path / "models" / "model.json"  # its folder is made
    own_threads = torch.get_num_threads()
    torch.set_num_threads(2)  # not the CPU default (tests run one thread a process), so that a count left behind shows
    try:
        _smoke_run(out, capsys)
    finally:
        torch.set_num_threads(own_threads)


def _smoke_run(out, capsys):
    # real timings of forwards this small are noisy on a busy machine: the fit's quality is not what this tests
    code = main(["calibrate", "--tower", "tiny", "--device", "cpu", *SMALL, "--accept-poor-fit", "--out", str(out)])
    assert code == 0
    captured = capsys.readouterr()
    assert "error" in captured.out and captured.out.count(" x ") >= 4  # one line per point, with its fit error
    assert "fit error: worst" in captured.out and "forwards" in captured.err  # the figures, and the progress on stderr
    model = load_time_model(out)
    assert (model.merge_size, model.patch_size, model.temporal_patch_size) == (2, 14, 2)
    body = json.loads(out.read_text())
    points = body["calibration"]["points"]
    assert [(p["images"], p["patches"]) for p in points[:4]] == [(1, [16]), (2, [16, 16]), (1, [64]), (2, [64, 64])]
    assert len(points) == 6 and all(len(set(p["patches"])) == 2 for p in points[4:])  # two mixes of both sides
    assert body["calibration"]["threads"] == 1  # the CPU default, as the CPU ranks of run and train
    assert torch.get_num_threads() == 2  # the process's own count is back
    assert body["calibration"]["sweep"]["max_patches"] == SWEEPS["cpu"].max_patches
    ReorderConfig(reorder_cost_model=str(out)).validate()


def test_a_good_fit_is_written_with_its_error_figures(tmp_path, capsys):
    out = tmp_path / "model.json"
    assert run_calibrate(["--tower", "tiny", "--device", "cpu", "--out", str(out)], synthetic_timer(true_seconds)) == 0
    captured = capsys.readouterr()
    assert "poor fit" not in captured.err and "left" in captured.err  # the bar's estimate of the time left
    body = json.loads(out.read_text())
    recorded = body["calibration"]["fit_error"]
    measured = [p["measured_ms"] for p in body["calibration"]["points"]]
    expected = fit_error(measured, [p["model_ms"] for p in body["calibration"]["points"]])
    assert (recorded["threshold"], recorded["accepted_poor_fit"]) == (POOR_FIT_THRESHOLD, False)
    # recorded from the unrounded times; the file's points are rounded to 0.1 us
    assert math.isclose(recorded["worst"], expected.worst, abs_tol=2e-4) and math.isclose(recorded["median"], expected.median, abs_tol=2e-4)
    assert abs(recorded["worst"]) < 0.01  # timings made by a model of this form are fit almost exactly
    assert f"fit error: worst {recorded['worst']:+.1%}" in captured.out and f"median {recorded['median']:.1%}" in captured.out
    assert len(measured) == len(forward_shapes(SWEEPS["cpu"], 2)) - 1  # the CPU default sweep, less the floor


def test_a_poor_fit_is_refused_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "model.json"
    out.write_text("an older model\n")
    assert run_calibrate(["--tower", "tiny", "--device", "cpu", *SMALL, "--out", str(out)], synthetic_timer(upside_down_seconds)) == 1
    captured = capsys.readouterr()
    refusal = [line for line in captured.err.splitlines() if "poor fit" in line]
    assert len(refusal) == 1 and "--accept-poor-fit" in refusal[0] and f"{POOR_FIT_THRESHOLD:.0%}" in refusal[0]
    assert "nothing written" in refusal[0] and "Traceback" not in captured.err
    assert out.read_text() == "an older model\n"  # refused before writing
    assert "fit error: worst" in captured.out  # the figures are still shown


def test_a_poor_fit_is_written_when_accepted(tmp_path, capsys):
    out = tmp_path / "model.json"
    argv = ["--tower", "tiny", "--device", "cpu", *SMALL, "--accept-poor-fit", "--out", str(out)]
    assert run_calibrate(argv, synthetic_timer(upside_down_seconds)) == 0
    assert "poor fit accepted" in capsys.readouterr().err
    recorded = json.loads(out.read_text())["calibration"]["fit_error"]
    assert abs(recorded["worst"]) > POOR_FIT_THRESHOLD == recorded["threshold"] and recorded["accepted_poor_fit"] is True
    assert 0 <= recorded["median"] <= abs(recorded["worst"])
    load_time_model(out)


def test_the_device_picks_the_default_sweep_and_flags_replace_its_parts():
    parse = build_parser().parse_args
    assert calibrate_cmd.resolve_sweep(parse(["calibrate", "--tower", "tiny", "--out", "m.json"]), "cuda") == SWEEPS["cuda"]
    cpu = parse(["calibrate", "--tower", "tiny", "--out", "m.json", "--device", "cpu", "--sides", "8,16", "--repeats", "3"])
    assert calibrate_cmd.resolve_sweep(cpu, "cpu") == replace(SWEEPS["cpu"], sides=(8, 16), repeats=3)
    # the GPU sweep stays what it was measured with (docs/benchmarks.md)
    assert SWEEPS["cuda"] == Sweep(sides=(8, 16, 32, 48, 64, 96, 128), counts=(1, 4, 16, 64), mixes=12, max_patches=65_536,
                                   repeats=5, warmup=2)


def test_the_cpu_default_sweep_is_bounded():
    cpu, cuda = SWEEPS["cpu"], SWEEPS["cuda"]
    shapes = forward_shapes(cpu, merge_size=2)
    runs = cpu.warmup + cpu.repeats
    assert len(shapes) <= 32 and max(sum(s * s for s in shape) for shape in shapes) <= 16_384
    assert max(max(shape) for shape in shapes) <= 64  # one image's attention grows with its patches squared
    patches = runs * sum(s * s for shape in shapes for s in shape)
    attention = runs * sum((s * s) ** 2 for shape in shapes for s in shape)
    gpu_attention = (cuda.warmup + cuda.repeats) * sum((s * s) ** 2 for shape in forward_shapes(cuda, 2) for s in shape)
    assert patches <= 2_000_000 and attention <= 5e9 and attention * 10 < gpu_attention


def test_any_callable_is_timed_over_the_sweep_in_warm_shuffled_rounds():
    seen = []

    def encoder(pixels, grid):
        seen.append((pixels.shape[0], tuple(map(tuple, grid.tolist()))))

    sweep = Sweep(sides=(2, 4, 6), counts=(1, 3), mixes=3, max_patches=65_536, repeats=3, warmup=1)
    model, points, fitted = calibrate(encoder, patch_dim=6, merge_size=2, patch_size=14, temporal_patch_size=2,
                                      device=torch.device("cpu"), dtype=torch.float32, sweep=sweep, log=lambda line: None)
    uniform = [(2, 1), (2, 3), (4, 1), (4, 3), (6, 1), (6, 3)]
    assert [p.sides for p in points[:6]] == [(s,) * c for s, c in uniform]
    mixes = [p.sides for p in points[6:]]
    assert len(mixes) == 3 and all(len(set(m)) > 1 and set(m) <= {2, 4, 6} for m in mixes)
    shapes = [(2,)] + [p.sides for p in points]  # the floor (one image of merge x merge patches) first
    calls = [(sum(s * s for s in shape), tuple((1, s, s) for s in shape)) for shape in shapes]
    assert seen[:len(shapes)] == calls  # the warm-up runs every shape once, in order
    rounds = [seen[len(shapes) * r:len(shapes) * (r + 1)] for r in range(1, 4)]
    assert len(seen) == 4 * len(shapes) and all(sorted(r) == sorted(calls) for r in rounds)
    assert rounds[0] != calls or rounds[1] != calls  # rounds are shuffled, not the sweep's order
    assert len(fitted) == 9 and model.per_image_ps + model.per_patch_ps + model.per_patch_squared_ps > 0


def test_progress_is_told_after_every_run_down_to_nothing_left():
    told = []
    forwards = [[[1, 2, 2]], [[1, 4, 4], [1, 2, 2]], [[1, 6, 6]]]
    time_in_rounds(lambda pixels, grid: None, forwards, patch_dim=6, device=torch.device("cpu"), dtype=torch.float32,
                   repeats=2, warmup=1, log=lambda line: None, progress=lambda *state: told.append(state))
    assert [done for done, _, _ in told] == list(range(1, 10)) and {total for _, total, _ in told} == {9}
    assert all(left >= 0 for _, _, left in told) and told[-1][2] == 0


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10_000), st.integers(0, 6), st.booleans()), min_size=1, max_size=20),
       st.floats(1e-9, 1e-3))
def test_time_left_is_exact_when_time_follows_size(forwards, rate):
    """Forwards that cost ``rate`` seconds per patch: whatever has run, the estimate is the true time left."""
    sizes = [size for size, _, _ in forwards]
    runs_left = [runs for _, runs, _ in forwards]
    last = [rate * size if ran else None for size, _, ran in forwards]
    exact = sum(runs * rate * size for size, runs, _ in forwards)
    estimate = seconds_left(last, runs_left, sizes)
    if any(ran for _, _, ran in forwards):
        assert math.isclose(estimate, exact, rel_tol=1e-9)
    else:
        assert estimate == 0  # nothing to go by yet


def test_mixed_shapes_are_seeded_capped_and_mix_sizes():
    first = mixed_shapes([8, 16, 32], merge_size=2, number=5, max_patches=65_536, seed=1)
    assert first == mixed_shapes([8, 16, 32], merge_size=2, number=5, max_patches=65_536, seed=1) and len(first) == 5
    assert all(2 <= len(m) <= 8 and len(set(m)) > 1 and sum(s * s for s in m) <= 65_536 for m in first)
    assert mixed_shapes([8], merge_size=2, number=5, max_patches=65_536) == []  # one size cannot mix
    assert all(sum(s * s for s in m) <= 2_000 for m in mixed_shapes([8, 16, 32], merge_size=2, number=4, max_patches=2_000))


def test_uniform_shapes_round_sides_to_the_merge_size_and_cap_forwards():
    assert uniform_shapes([3, 4], [1, 2], merge_size=2, max_patches=65_536) == [(4, 1), (4, 2)]
    assert uniform_shapes([8, 100], [1, 8], merge_size=2, max_patches=10_000) == [(8, 1), (8, 8), (100, 1)]
    with pytest.raises(ValueError, match="no forward"):
        uniform_shapes([200], [1], merge_size=2, max_patches=100)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_refuses_without_a_gpu_unless_told_cpu(tmp_path, capsys):
    assert main(["calibrate", "--tower", "tiny", "--out", str(tmp_path / "m.json")]) == 2
    assert "--device: no GPU found" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_a_folder_as_out_is_refused_before_any_timing(tmp_path, capsys):
    assert main(["calibrate", "--tower", "tiny", "--device", "cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "is a folder" in err and "Traceback" not in err


@pytest.mark.parametrize("flags, named", [(["--repeats", "0"], "--repeats"), (["--warmup", "-1"], "--warmup"),
                                          (["--mixes", "-2"], "--mixes"), (["--threads", "0"], "--threads"),
                                          (["--max-patches-per-forward", "10"], "--max-patches-per-forward")])
def test_bad_sweep_flags_are_refused_naming_the_flag(tmp_path, capsys, flags, named):
    out = tmp_path / "m.json"
    assert run_calibrate(["--tower", "tiny", "--device", "cpu", *flags, "--out", str(out)], synthetic_timer(true_seconds)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mimo-pipes calibrate: {named}") and len(err.strip().splitlines()) == 1 and not out.exists()


def test_unknown_tower_is_refused(tmp_path, capsys):
    assert main(["calibrate", "--tower", str(tmp_path / "none"), "--device", "cpu", "--out", str(tmp_path / "m.json")]) == 2
    assert "--tower" in capsys.readouterr().err


def test_help_describes_the_command_and_every_flag(capsys):
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    text = capsys.readouterr().out
    assert "Time a vision encoder" in text and "--accept-poor-fit" in text and f"{POOR_FIT_THRESHOLD:.0%}" in text
    parser = argparse.ArgumentParser()
    calibrate_cmd.add_arguments(parser)
    assert all(action.help for action in parser._actions)
