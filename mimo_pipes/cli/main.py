"""The ``mimo-pipes`` command line: one subcommand per job, each in its own module."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence

# name -> (module under mimo_pipes.cli.commands, one line for the top-level help)
COMMANDS = {
    "run": ("run_cmd", "run the balanced MIMO input pipeline on local ranks or under torchrun, and summarise it"),
    "analyze": ("analyze_cmd", "offline, in one process: what reordering would do for run's flags (JSON and plots)"),
    "check": ("check_cmd", "check every row of a dataset as a run would process it, without training"),
    "train": ("train_cmd", "train a tiny non-colocated MIMO model on the pipeline (CPU, Gloo)"),
    "balance": ("balance_cmd", "read cost windows as JSON lines, write the balanced slots"),
    "calibrate": ("calibrate_cmd", "time a vision encoder and write the time model --reorder-cost-model reads"),
}
DESCRIPTION = "Balanced, checkpointable input pipelines for non-colocated multimodal training.\n\ncommands:\n" + "\n".join(
    f"  {name:<10} {summary}" for name, (_, summary) in COMMANDS.items()
) + "\n\n'mimo-pipes COMMAND --help' describes a command and every flag it takes."


class Parser(argparse.ArgumentParser):
    """argparse, with "did you mean" for a mistyped command or flag, and no abbreviated flags (a prefix of
    a flag is refused with a suggestion, never taken silently for the flag)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> None:  # type: ignore[override]
        suggestion = _suggestion(self, message)
        super().error(message + (f"; did you mean {suggestion}?" if suggestion else ""))


def _subcommand_options(parser: argparse.ArgumentParser) -> list[str]:
    """The flags of the subcommand being parsed (the top-level parser reports their unknown flags)."""
    argv = sys.argv[1:] if getattr(parser, "argv", None) is None else parser.argv  # type: ignore[attr-defined]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = next((action.choices[word] for word in argv if word in action.choices), None)
            if chosen is not None:
                return [option for sub in chosen._actions for option in sub.option_strings]
    return [option for action in parser._actions for option in action.option_strings]


def _suggestion(parser: argparse.ArgumentParser, message: str) -> str | None:
    choices: list[str] = []
    wrong: list[str] = []
    if message.startswith("unrecognized arguments: "):
        wrong = [word.split("=")[0] for word in message.removeprefix("unrecognized arguments: ").split() if word.startswith("-")]
        choices = _subcommand_options(parser)
    elif "invalid choice: " in message:
        wrong = [message.split("invalid choice: ")[1].split()[0].strip("'\"")]
        choices = list(COMMANDS)
    for word in wrong:
        close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
        if close:
            return close[0]
    return None


def build_parser() -> argparse.ArgumentParser:
    import importlib

    from mimo_pipes.cli.commands.help_format import HelpFormatter

    parser = Parser(prog="mimo-pipes", usage="mimo-pipes [-h] COMMAND ...", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser, help=argparse.SUPPRESS)
    for name, (module, summary) in COMMANDS.items():
        importlib.import_module(f"mimo_pipes.cli.commands.{module}").add_arguments(
            commands.add_parser(name, prog=f"mimo-pipes {name}", help=summary, description=summary, formatter_class=HelpFormatter)
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import importlib

    parser = build_parser()
    parser.argv = list(sys.argv[1:] if argv is None else argv)  # type: ignore[attr-defined]
    args = parser.parse_args(parser.argv)  # type: ignore[attr-defined]
    from mimo_pipes.config.flags import flag_names
    from mimo_pipes.observe.third_party import paused_gc

    with paused_gc():  # the command's modules (torch and the rest) load here
        command = importlib.import_module(f"mimo_pipes.cli.commands.{COMMANDS[args.command][0]}")
    with flag_names():  # a setting's error names the flag the user typed, not the field
        return command.run(args)


if __name__ == "__main__":
    sys.exit(main())
