"""How a configuration error names its setting: by the name the user wrote it with.

In Python a setting is a field (``PipelineConfig(micro_batch_size=...)``): errors name ``micro_batch_size``.
On the command line it is a flag: the ``mimo-pipes`` commands run under :func:`flag_names`, and the same
errors name ``--micro-batch-size``. The choice travels in the environment, so the ranks a command spawns
(and ``torchrun``'s, each running the command) name flags too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from mimo_pipes.errors import SETTING_NAMES as NAMING
from mimo_pipes.errors import setting_name

_FLAGS = {  # fields whose flag is not the field's name with dashes
    "components": "--component",
    "exchange_timeout_s": "--exchange-timeout",
    "overlap_intra_microbatch_reorder": "--no-overlap-intra-microbatch-reorder",
    "progress": "--quiet",  # a job option (cli/job/options.py), named in resume checks
}


def cli_flag(field_name: str) -> str:
    """The command-line flag of a configuration field (``reorder_window_size`` -> ``--reorder-window-size``)."""
    return _FLAGS.get(field_name, "--" + field_name.replace("_", "-"))


def flag(field_name: str) -> str:
    """The name an error gives a configuration field: the field itself, or its flag inside a command."""
    return setting_name(field_name, cli_flag(field_name))


@contextmanager
def flag_names() -> Iterator[None]:
    """Errors raised inside name settings by their flags (a command line's words); restored on exit."""
    before = os.environ.get(NAMING)
    os.environ[NAMING] = "flags"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NAMING, None)
        else:
            os.environ[NAMING] = before
