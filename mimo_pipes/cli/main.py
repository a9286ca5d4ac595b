"""``mimo-pipes`` command line: ``balance`` (assignment as a filter), ``run`` (the main job) and ``analyze``
(what reordering would do, offline)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from mimo_pipes.cli import analyze_cmd, balance_cmd, calibrate_cmd, run_cmd, train_cmd
    from mimo_pipes.cli.help_format import HelpFormatter

    parser = argparse.ArgumentParser(prog="mimo-pipes", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    balance_cmd.add_arguments(
        commands.add_parser(
            "balance", help="read cost windows as JSON lines, write balanced slots", formatter_class=HelpFormatter
        )
    )
    run_cmd.add_arguments(
        commands.add_parser("run", help="run the balanced MIMO input pipeline", formatter_class=HelpFormatter)
    )
    calibrate_cmd.add_arguments(
        commands.add_parser(
            "calibrate",
            help="time a vision encoder and write the time model --reorder-cost-model reads",
            formatter_class=HelpFormatter,
        )
    )
    analyze_cmd.add_arguments(
        commands.add_parser("analyze", help="offline: what reordering would do for run's flags (JSON + PNG)",
                            description=analyze_cmd.__doc__, formatter_class=HelpFormatter)
    )
    train_cmd.add_arguments(
        commands.add_parser(
            "train", help="train a tiny non-colocated MIMO model on the pipeline (CPU, Gloo)", formatter_class=HelpFormatter
        )
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "balance":
        from mimo_pipes.cli import balance_cmd

        return balance_cmd.run(args)
    if args.command == "calibrate":
        from mimo_pipes.cli import calibrate_cmd

        return calibrate_cmd.run(args)
    if args.command == "analyze":
        from mimo_pipes.cli import analyze_cmd

        return analyze_cmd.run(args)
    if args.command == "train":
        from mimo_pipes.cli import train_cmd

        return train_cmd.run(args)
    from mimo_pipes.cli import run_cmd

    return run_cmd.run(args)


if __name__ == "__main__":
    sys.exit(main())
