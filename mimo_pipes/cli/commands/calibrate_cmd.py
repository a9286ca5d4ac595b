"""``mimo-pipes calibrate``: time a vision tower, fit the time model, write the JSON ``--reorder-cost-model`` reads."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mimo_pipes.cli.commands.argtypes import path, positive_ints
from mimo_pipes.cli.job.output_paths import check_output_file
from mimo_pipes.errors import ConfigError

if TYPE_CHECKING:  # torch is imported by the command only: the parser of every command is built
    from mimo_pipes.time_model.calibrate import Progress, Timer
    from mimo_pipes.time_model.sweep import Sweep

DTYPES = ("bfloat16", "float16", "float32")


def _defaults(field: str) -> str:
    """A sweep setting's default on each device, for its help text."""
    from mimo_pipes.time_model.sweep import SWEEPS  # torch-free: the parser of every command is built

    def shown(value: object) -> str:
        return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)

    values = {device: shown(getattr(sweep, field)) for device, sweep in SWEEPS.items()}
    if len(set(values.values())) == 1:
        return next(iter(values.values()))
    return "; ".join(f"{value} on {device}" for device, value in values.items())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mimo_pipes.time_model.fit import POOR_FIT_THRESHOLD  # torch-free, as above

    parser.description = (
        "Time a vision encoder's forward over image sizes and images per forward, fit a per-forward floor and "
        "per-image terms (a + b*patches + c*patches^2, non-negative least squares), print the fit error of every "
        "point and the worst and median, and write the JSON that --reorder-cost-model reads. The sweep's defaults "
        "depend on --device (a CPU sweep stops at smaller images); progress and the time left go to stderr. "
        f"A fit whose worst point is off by more than {POOR_FIT_THRESHOLD:.0%} is refused (exit 1, nothing written) "
        "unless --accept-poor-fit is given."
    )
    parser.add_argument("--tower", type=path, required=True, metavar="SOURCE",
                        help="a preset (qwen2-vl-675m, tiny) or a folder with a vision or Qwen2-VL config.json "
                             "(its weights are loaded when present)")
    parser.add_argument("--out", type=path, required=True, metavar="PATH", help="the JSON file to write")
    parser.add_argument("--device", default="cuda",
                        help="where to time, which also picks the sweep's defaults: cuda (refused without a GPU) or cpu (default: cuda)")
    parser.add_argument("--dtype", default=None, choices=DTYPES, help="the tower's precision (default: bfloat16 on cuda, float32 on cpu)")
    parser.add_argument("--attn-implementation", default="sdpa", help="the tower's attention (default: sdpa)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads torch uses while timing (default: 1 on cpu, as in the CPU ranks of run and train; "
                             "torch's own on cuda)")
    parser.add_argument("--sides", type=positive_ints, default=None, metavar="S,S,...",
                        help=f"image sides in patches, comma-separated (default: {_defaults('sides')})")
    parser.add_argument("--images-per-forward", type=positive_ints, default=None, metavar="N,N,...",
                        help=f"images per forward, comma-separated (default: {_defaults('counts')})")
    parser.add_argument("--max-patches-per-forward", type=int, default=None, metavar="N",
                        help=f"leave out the forwards of more patches than this (default: {_defaults('max_patches')})")
    parser.add_argument("--mixes", type=int, default=None, metavar="N",
                        help=f"forwards that mix image sizes drawn from --sides, 2-8 images each (default: {_defaults('mixes')})")
    parser.add_argument("--repeats", type=int, default=None, metavar="N",
                        help=f"rounds: every forward is timed once per round, each round in its own order; median kept (default: {_defaults('repeats')})")
    parser.add_argument("--warmup", type=int, default=None, metavar="N",
                        help=f"untimed runs of every forward before the rounds (default: {_defaults('warmup')})")
    parser.add_argument("--accept-poor-fit", action="store_true",
                        help=f"write the model even when the fit's worst point is off by more than {POOR_FIT_THRESHOLD:.0%}% "
                             "(default: such a fit is refused and nothing is written)")


def resolve_sweep(args: argparse.Namespace, device_type: str) -> Sweep:
    """The device's default sweep with the flags given on the command line in place of its defaults."""
    from mimo_pipes.time_model.sweep import SWEEPS

    given = {"sides": args.sides, "counts": args.images_per_forward, "max_patches": args.max_patches_per_forward,
             "mixes": args.mixes, "repeats": args.repeats, "warmup": args.warmup}
    sweep = dataclasses.replace(SWEEPS[device_type], **{name: value for name, value in given.items() if value is not None})
    if sweep.repeats < 1:
        raise ConfigError("--repeats", f"must be >= 1, got {sweep.repeats}")
    if sweep.warmup < 0:
        raise ConfigError("--warmup", f"must be >= 0, got {sweep.warmup}")
    if sweep.mixes < 0:
        raise ConfigError("--mixes", f"must be >= 0, got {sweep.mixes}")
    if sweep.max_patches < 1:
        raise ConfigError("--max-patches-per-forward", f"must be >= 1, got {sweep.max_patches}")
    return sweep


def run(args: argparse.Namespace, *, timer: Timer | None = None) -> int:
    """``timer`` times the forwards in place of :func:`~mimo_pipes.time_model.calibrate.time_in_rounds`
    (a caller can give synthetic timings)."""
    try:
        return _run(args, timer)
    except ConfigError as error:
        print(f"mimo-pipes calibrate: {error}", file=sys.stderr)
        return 2


def _progress_bar(total: int) -> tuple[Progress, Callable[[], None], Callable[[str], None]]:
    """A bar on stderr of ``total`` runs, told after every one (runs done, in all, the estimated time left);
    its close; and a print to stdout that keeps the bar whole."""
    from tqdm import tqdm

    bar = tqdm(total=total, desc="calibrate", file=sys.stderr, dynamic_ncols=True,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} forwards [{elapsed} elapsed{postfix}]")

    def update(done: int, total: int, left: float) -> None:
        bar.total = total
        bar.set_postfix_str(f"about {tqdm.format_interval(left)} left", refresh=False)
        bar.update(done - bar.n)

    return update, bar.close, lambda line: tqdm.write(line, file=sys.stdout)


def _run(args: argparse.Namespace, timer: Timer | None) -> int:
    import torch

    from mimo_pipes.time_model.calibrate import fit_report
    from mimo_pipes.time_model.fit import POOR_FIT_THRESHOLD, fit_error
    from mimo_pipes.time_model.model import save_time_model

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", "no GPU found: calibrate on the GPU that will run the encoder, or pass --device cpu to time the CPU")
    if device.type not in ("cuda", "cpu"):
        raise ConfigError("--device", f"must be cuda or cpu, got {args.device!r}")
    sweep = resolve_sweep(args, device.type)
    threads = args.threads if args.threads is not None else (1 if device.type == "cpu" else torch.get_num_threads())
    if threads < 1:
        raise ConfigError("--threads", f"must be >= 1, got {threads}")
    out = Path(args.out)
    check_output_file(out, "--out")  # before the timing, which can take minutes
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    model, points, fitted = _measure(args, sweep, device, dtype, threads, timer)
    for line in fit_report(model, points, fitted):
        print(line)
    error = fit_error([point.seconds for point in points], fitted)
    if error.is_poor() and not args.accept_poor_fit:
        print(f"mimo-pipes calibrate: poor fit: the worst point ({points[error.worst_index].describe()}) is off by "
              f"{error.worst:+.1%}, beyond {POOR_FIT_THRESHOLD:.0%}; nothing written to {out}: calibrate again on a quiet "
              "machine, or pass --accept-poor-fit to write it anyway", file=sys.stderr)
        return 1
    if error.is_poor():
        print(f"mimo-pipes calibrate: warning: poor fit accepted (--accept-poor-fit): the worst point is off by {error.worst:+.1%}",
              file=sys.stderr)
    calibration = {
        "tower": args.tower,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "attn_implementation": args.attn_implementation,
        "threads": threads,
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "sweep": dataclasses.asdict(sweep),
        "fit_error": {"worst": round(error.worst, 4), "median": round(error.median, 4), "threshold": POOR_FIT_THRESHOLD,
                      "accepted_poor_fit": error.is_poor()},
        "points": [
            {"images": p.count, "patches": p.patches, "measured_ms": round(p.seconds * 1e3, 4), "model_ms": round(f * 1e3, 4)}
            for p, f in zip(points, fitted)
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    path = save_time_model(model, out, calibration)
    print(f"wrote {path}; use it with --reorder-cost-model {path} (fingerprint {model.fingerprint()[:12]})")
    return 0


def _measure(args: argparse.Namespace, sweep: Sweep, device: Any, dtype: Any, threads: int, timer: Timer | None) -> tuple[Any, list[Any], list[float]]:
    """Build the tower and calibrate it with ``threads`` CPU threads (the process's own count is restored after)."""
    import torch

    from mimo_pipes.demo_model.encoders import build_vision_tower, encode, patch_dim
    from mimo_pipes.time_model.calibrate import calibrate, time_in_rounds
    from mimo_pipes.time_model.sweep import forward_shapes

    own_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        try:
            tower = build_vision_tower(args.tower, dtype=dtype, device=device, attn_implementation=args.attn_implementation)
        except ValueError as error:
            raise ConfigError("--tower", str(error)) from None
        config = tower.config
        try:
            forwards = len(forward_shapes(sweep, config.spatial_merge_size))
        except ValueError as error:
            raise ConfigError("--max-patches-per-forward", f"{error}: raise it or give smaller --sides") from None
        print(f"calibrating {args.tower} on {device} ({str(dtype).removeprefix('torch.')}, {args.attn_implementation}, "
              f"{threads} CPU thread{'s' if threads > 1 else ''}): {forwards} forwards, {sweep.warmup} warm-up and {sweep.repeats} timed runs each", flush=True)
        progress, close_bar, write = _progress_bar(forwards * (sweep.warmup + sweep.repeats))
        try:
            return calibrate(
                lambda pixels, grid: encode(tower, pixels, grid),
                patch_dim=patch_dim(config),
                merge_size=config.spatial_merge_size,
                patch_size=config.patch_size,
                temporal_patch_size=config.temporal_patch_size,
                device=device,
                dtype=dtype,
                sweep=sweep,
                log=write,
                progress=progress,
                timer=timer or time_in_rounds,
            )
        finally:
            close_bar()
    finally:
        torch.set_num_threads(own_threads)
