"""How every subcommand's ``--help`` describes its flags.

The convention: every ``add_argument`` gets a ``help`` that says what the flag does. The default is
appended by :class:`HelpFormatter` as ``(default: VALUE)``; a flag whose default is ``None`` says in its
help what happens without it, ending with ``(default: ...)`` written out (e.g. ``(default: the embedded
data)``). On/off flags (``store_true``) need no default: they are off unless given; a required flag
says ``(required)``.
"""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: VALUE)`` to a flag's help unless it takes no value, has no default (None),
    or its help already names the default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required and action.option_strings:
            return f"{text} (required)"
        if (
            "default" in text
            or action.default in (None, argparse.SUPPRESS)
            or action.nargs == 0
            or not action.option_strings
        ):
            return text
        if isinstance(action.default, bool):  # as the flag is typed: true / false
            return f"{text} (default: {str(action.default).lower()})"
        return f"{text} (default: %(default)s)"
