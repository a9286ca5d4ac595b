"""`mimo-pipes calibrate`: a CPU smoke run with the tiny tower, any callable from Python, and refusals."""

from __future__ import annotations

import json

import pytest
import torch

from mimo_pipes.cli.main import main
from mimo_pipes.config import ReorderConfig
from mimo_pipes.time_model.calibrate import calibrate, mixed_shapes, sweep
from mimo_pipes.time_model.model import load_time_model


def test_cpu_smoke_run_with_the_tiny_tower_writes_a_loadable_model(tmp_path, capsys):
    out = tmp_path / "models" / "model.json"  # its folder is made
    code = main(["calibrate", "--tower", "tiny", "--device", "cpu", "--sides", "4,8", "--images-per-forward", "1,2",
                 "--mixes", "2", "--repeats", "1", "--warmup", "0", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "error" in printed and printed.count(" x ") >= 4  # one line per point, with its fit error
    model = load_time_model(out)
    assert (model.merge_size, model.patch_size, model.temporal_patch_size) == (2, 14, 2)
    body = json.loads(out.read_text())
    points = body["calibration"]["points"]
    assert [(p["images"], p["patches"]) for p in points[:4]] == [(1, [16]), (2, [16, 16]), (1, [64]), (2, [64, 64])]
    assert len(points) == 6 and all(len(set(p["patches"])) == 2 for p in points[4:])  # two mixes of both sides
    ReorderConfig(reorder_cost_model=str(out)).validate()


def test_any_callable_is_timed_over_the_sweep_in_warm_shuffled_rounds():
    seen = []

    def encoder(pixels, grid):
        seen.append((pixels.shape[0], tuple(map(tuple, grid.tolist()))))

    model, points, fitted = calibrate(encoder, patch_dim=6, merge_size=2, patch_size=14, temporal_patch_size=2,
                                      device=torch.device("cpu"), dtype=torch.float32, sides=[2, 4, 6], counts=[1, 3],
                                      mixes=3, repeats=3, warmup=1, log=lambda line: None)
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


def test_mixed_shapes_are_seeded_capped_and_mix_sizes():
    first = mixed_shapes([8, 16, 32], merge_size=2, number=5, seed=1)
    assert first == mixed_shapes([8, 16, 32], merge_size=2, number=5, seed=1) and len(first) == 5
    assert all(2 <= len(m) <= 8 and len(set(m)) > 1 and sum(s * s for s in m) <= 65_536 for m in first)
    assert mixed_shapes([8], merge_size=2, number=5) == []  # one size cannot mix
    assert all(sum(s * s for s in m) <= 2_000 for m in mixed_shapes([8, 16, 32], merge_size=2, number=4, max_patches=2_000))


def test_sweep_rounds_sides_to_the_merge_size_and_caps_forwards():
    assert sweep([3, 4], [1, 2], merge_size=2) == [(4, 1), (4, 2)]
    assert sweep([8, 100], [1, 8], merge_size=2, max_patches=10_000) == [(8, 1), (8, 8), (100, 1)]
    with pytest.raises(ValueError, match="no forward"):
        sweep([200], [1], merge_size=2, max_patches=100)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_refuses_without_a_gpu_unless_told_cpu(tmp_path, capsys):
    assert main(["calibrate", "--tower", "tiny", "--out", str(tmp_path / "m.json")]) == 2
    assert "--device: no GPU found" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_a_folder_as_out_is_refused_before_any_timing(tmp_path, capsys):
    assert main(["calibrate", "--tower", "tiny", "--device", "cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "is a folder" in err and "Traceback" not in err


def test_unknown_tower_is_refused(tmp_path, capsys):
    assert main(["calibrate", "--tower", str(tmp_path / "none"), "--device", "cpu", "--out", str(tmp_path / "m.json")]) == 2
    assert "--tower" in capsys.readouterr().err
