"""``mimo-pipes`` command line: ``balance`` (assignment as a filter) and ``run`` (the main job)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from mimo_pipes.cli import balance_cmd, run_cmd, train_cmd

    parser = argparse.ArgumentParser(prog="mimo-pipes", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    balance_cmd.add_arguments(
        commands.add_parser("balance", help="read cost windows as JSON lines, write balanced slots")
    )
    run_cmd.add_arguments(commands.add_parser("run", help="run the balanced MIMO input pipeline"))
    train_cmd.add_arguments(commands.add_parser("train", help="train a tiny non-colocated MIMO model on the pipeline (CPU, Gloo)"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "balance":
        from mimo_pipes.cli import balance_cmd

        return balance_cmd.run(args)
    if args.command == "train":
        from mimo_pipes.cli import train_cmd

        return train_cmd.run(args)
    from mimo_pipes.cli import run_cmd

    return run_cmd.run(args)


if __name__ == "__main__":
    sys.exit(main())
