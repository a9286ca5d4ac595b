"""``mimo-pipes balance``: JSON lines in, balanced slots out (contract in docs/design.md).

One JSON object per input line, one JSON line per input line on stdout, flushed as it is written.

* ``{"costs": [c0, c1, ...], "slots": G}`` -> ``{"slots": [[i, ...], ...]}``
* ``{"costs": [[...], [...]], "slots": G, "across_microbatches": true}``
  -> ``{"microbatches": [[[i, ...] per slot] per micro-batch]}``, i indexing the flattened window
  (m*B + j). Nested costs without ``across_microbatches`` (or with false) balance every micro-batch
  where it stands and answer in the same ``microbatches`` form.

Blank lines are skipped. The first bad line stops the command with exit status 2 and one line on
stderr naming the line number and the problem; lines answered before it stay written. A request that
cannot get the memory it needs (MemoryError) is answered the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import BinaryIO, TextIO

from mimo_pipes.balance import balance_microbatch, balance_window
from mimo_pipes.errors import json_error_text

EXIT_BAD_INPUT = 2
_KEYS = ("costs", "slots", "across_microbatches")


class _BadLine(ValueError):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Read JSON lines {\"costs\": [...], \"slots\": G} (or nested costs for a window, with "
        "optional \"across_microbatches\": true) on stdin and write one JSON line of balanced "
        "slots per input line. Bad input: exit status 2 and one line on stderr."
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def answer(request: object) -> dict:
    """The output object for one parsed request; raises ValueError with a clear message."""
    if not isinstance(request, dict):
        raise _BadLine(f"expected a JSON object, got {type(request).__name__}")
    unknown = sorted(key for key in request if key not in _KEYS)
    if unknown:
        raise _BadLine(f"unknown key {unknown[0]!r} (allowed: {', '.join(_KEYS)})")
    for key in ("costs", "slots"):
        if key not in request:
            raise _BadLine(f"missing key {key!r}")
    costs, slots = request["costs"], request["slots"]
    across = request.get("across_microbatches", False)
    if not isinstance(across, bool):
        raise _BadLine(f"across_microbatches must be true or false, got {json.dumps(across)}")
    if not _is_int(slots) or slots < 1:
        raise _BadLine(f"slots must be an integer >= 1, got {json.dumps(slots)}")
    if not isinstance(costs, list):
        raise _BadLine(f"costs must be a list, got {json.dumps(costs)[:40]}")
    nested = [isinstance(row, list) for row in costs]
    if costs and all(nested):
        return {"microbatches": balance_window(costs, slots, across_microbatches=across)}
    if any(nested):
        raise _BadLine("costs must be a list of integers or a list of lists of integers, not a mix")
    if across:
        raise _BadLine("across_microbatches needs nested costs (a list of micro-batches)")
    return {"slots": balance_microbatch(costs, slots)}


def serve(stdin: BinaryIO, stdout: TextIO, stderr: TextIO) -> int:
    line = [0]  # the line being answered, for the message if memory runs out
    try:
        return _serve(stdin, stdout, stderr, line)
    except MemoryError:
        # The request needs more memory than the process may have (an address-space limit, a small
        # machine): one line, like any request that cannot be answered. Planning memory is linear in the
        # samples (docs/benchmarks.md has the figure), so this names a limit, not a bug.
        stderr.write(
            f"mimo-pipes balance: line {line[0]}: out of memory answering this request"
            " (raise the memory limit or send smaller windows)\n"
        )
        return EXIT_BAD_INPUT


def _serve(stdin: BinaryIO, stdout: TextIO, stderr: TextIO, line: list[int]) -> int:
    for number, raw in enumerate(stdin, start=1):
        line[0] = number
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            stderr.write(f"mimo-pipes balance: line {number}: not valid UTF-8\n")
            return EXIT_BAD_INPUT
        if not text.strip():
            continue
        try:
            request = json.loads(text.rstrip("\r\n"))  # the newline would move an error at the end to a line 2, column 1
        except json.JSONDecodeError as exc:
            stderr.write(
                f"mimo-pipes balance: line {number}: invalid JSON: {json_error_text(exc, line=False)}\n"
            )
            return EXIT_BAD_INPUT
        except RecursionError:  # the decoder recurses once per nesting level
            stderr.write(f"mimo-pipes balance: line {number}: JSON nested too deeply\n")
            return EXIT_BAD_INPUT
        try:
            result = answer(request)
        except (ValueError, TypeError, RecursionError) as exc:
            message = " ".join(str(exc).split()) or type(exc).__name__
            stderr.write(f"mimo-pipes balance: line {number}: {message}\n")
            return EXIT_BAD_INPUT
        stdout.write(json.dumps(result, separators=(",", ":")) + "\n")
        stdout.flush()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return serve(sys.stdin.buffer, sys.stdout, sys.stderr)
    except BrokenPipeError:
        # The reader went away; nothing more can be written.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return 1
    except KeyboardInterrupt:
        return 130
