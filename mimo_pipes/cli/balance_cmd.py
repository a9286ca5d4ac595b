"""``mimo-pipes balance``: JSON lines in, balanced slots out (contract in DESIGN.md)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError
