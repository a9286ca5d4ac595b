"""``mimo-pipes calibrate``: time a vision tower, fit the time model, write the JSON ``--reorder-cost-model`` reads."""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from mimo_pipes.cli.argtypes import path, positive_ints
from mimo_pipes.errors import ConfigError

DTYPES = ("bfloat16", "float16", "float32")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mimo_pipes.time_model.fit import DEFAULT_COUNTS, DEFAULT_MIXES, DEFAULT_SIDES  # torch-free: the parser of every command is built

    parser.description = (
        "Time a vision encoder's forward over image sizes and images per forward, fit a per-forward floor and "
        "per-image terms (a + b*patches + c*patches^2, non-negative least squares), print the fit error of every "
        "point and write the JSON that --reorder-cost-model reads."
    )
    parser.add_argument("--tower", type=path, required=True, metavar="SOURCE",
                        help="a preset (qwen2-vl-675m, tiny) or a folder with a vision or Qwen2-VL config.json "
                             "(its weights are loaded when present)")
    parser.add_argument("--out", type=path, required=True, metavar="PATH", help="the JSON file to write")
    parser.add_argument("--device", default="cuda", help="cuda (default; refused without a GPU) or cpu")
    parser.add_argument("--dtype", default=None, choices=DTYPES, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--attn-implementation", default="sdpa", help="the tower's attention (default: sdpa)")
    parser.add_argument("--sides", type=positive_ints, default=list(DEFAULT_SIDES),
                        help=f"image sides in patches, comma-separated (default: {','.join(map(str, DEFAULT_SIDES))})")
    parser.add_argument("--images-per-forward", type=positive_ints, default=list(DEFAULT_COUNTS),
                        help=f"images per forward, comma-separated (default: {','.join(map(str, DEFAULT_COUNTS))})")
    parser.add_argument("--mixes", type=int, default=DEFAULT_MIXES,
                        help=f"forwards that mix image sizes drawn from --sides, 2-8 images each (default: {DEFAULT_MIXES})")
    parser.add_argument("--repeats", type=int, default=5,
                        help="rounds: every forward is timed once per round, each round in its own order; median kept (default: 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs of every forward before the rounds (default: 2)")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ConfigError as error:
        print(f"mimo-pipes calibrate: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    import torch

    from mimo_pipes.encoders import build_vision_tower, encode, patch_dim
    from mimo_pipes.time_model.calibrate import calibrate, fit_report
    from mimo_pipes.time_model.model import save_time_model

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", "no GPU found: calibrate on the GPU that will run the encoder, or pass --device cpu to time the CPU")
    if device.type not in ("cuda", "cpu"):
        raise ConfigError("--device", f"must be cuda or cpu, got {args.device!r}")
    if args.repeats < 1 or args.warmup < 0:
        raise ConfigError("--repeats", "must be >= 1 (and --warmup >= 0)")
    if args.mixes < 0:
        raise ConfigError("--mixes", f"must be >= 0, got {args.mixes}")
    out = Path(args.out)  # checked before the timing, which can take minutes
    if out.is_dir():
        raise ConfigError("--out", f"{out} is a folder: give the path of the JSON file to write")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError("--out", f"cannot create the folder {out.parent} ({error.strerror or error})") from None
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    try:
        tower = build_vision_tower(args.tower, dtype=dtype, device=device, attn_implementation=args.attn_implementation)
    except ValueError as error:
        raise ConfigError("--tower", str(error)) from None
    config = tower.config
    print(f"calibrating {args.tower} on {device} ({args.dtype or dtype}, {args.attn_implementation})", flush=True)
    model, points, fitted = calibrate(
        lambda pixels, grid: encode(tower, pixels, grid),
        patch_dim=patch_dim(config),
        merge_size=config.spatial_merge_size,
        patch_size=config.patch_size,
        temporal_patch_size=config.temporal_patch_size,
        device=device,
        dtype=dtype,
        sides=args.sides,
        counts=args.images_per_forward,
        mixes=args.mixes,
        repeats=args.repeats,
        warmup=args.warmup,
        log=lambda line: print(line, flush=True),
    )
    for line in fit_report(model, points, fitted):
        print(line)
    calibration = {
        "tower": args.tower,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "attn_implementation": args.attn_implementation,
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "points": [
            {"images": p.count, "patches": p.patches, "measured_ms": round(p.seconds * 1e3, 4), "model_ms": round(f * 1e3, 4)}
            for p, f in zip(points, fitted)
        ],
    }
    path = save_time_model(model, out, calibration)
    print(f"wrote {path}; use it with --reorder-cost-model {path} (fingerprint {model.fingerprint()[:12]})")
    return 0
