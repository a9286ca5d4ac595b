"""Exceptions that name what went wrong: the setting, the sample, or the rank; how a setting is named (field or
flag, :func:`setting_name`); and the check of a count, :func:`as_count`.

``ConfigError`` and ``SampleError`` can also be rebuilt from their message alone, as pickling and
torch's ``ExceptionWrapper`` (which torchdata's mappers use to carry a worker's exception to the
caller) rebuild an exception: ``type(message)``. So ``except SampleError`` still matches, with
``sample_id`` / ``field`` / ``setting`` recovered from the message, after a hop through a worker.
"""

from __future__ import annotations

import ast
import numbers
import os
import re
import sys


def _own_line(cls: type, text: str) -> str:
    """The exception's own one-line message: ``text`` itself, or, in a re-raised worker traceback, what
    follows the last ``...ClassName: `` line."""
    marker = f"{cls.__name__}: "
    for line in reversed(text.splitlines()):
        head, found, rest = line.partition(marker)
        if found and (not head or head.endswith(".")) and " " not in head:
            return rest
    return text


def _repr_prefix(text: str, ends: str) -> tuple[object, str] | None:
    """Split ``text`` after the shortest prefix that is the repr of a value and is followed by one of
    the separators ``ends`` (a regex); returns (value, rest after the separator)."""
    for match in re.finditer(ends, text):
        head = text[: match.start()]
        try:
            value = ast.literal_eval(head)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if repr(value) == head:
            return value, text[match.start() :]
    return None


def _parse_sample_message(line: str) -> tuple[object, str | None, str] | None:
    """(sample id, field, message) from "sample 12, field 'pixel_values': message"."""
    if not line.startswith("sample "):
        return None
    split = _repr_prefix(line[len("sample ") :], r", field |: ")
    if split is None:
        return None
    sample_id, rest = split
    if rest.startswith(": "):
        return sample_id, None, rest[2:]
    split = _repr_prefix(rest[len(", field ") :], r": ")
    if split is None or not isinstance(split[0], str):
        return None
    return sample_id, split[0], split[1][2:]


_FIELD_OF_FLAG: dict[str, str] = {}  # filled by the config package (name_flags_as_fields), which imports this module


def name_flags_as_fields(fields_by_flag: dict[str, str]) -> None:
    """Registers the configuration fields a flag sets (``--split-part`` -> ``split_part``), for :func:`_as_named`."""
    _FIELD_OF_FLAG.update(fields_by_flag)


def _as_named(setting: str) -> str:
    """A setting given by its flag (``--dataset``), named as the caller wrote it: the flag inside a command, the
    field (``dataset``) from Python, for the settings that are fields (see :data:`SETTING_NAMES`)."""
    if os.environ.get(SETTING_NAMES) == "flags":
        return setting
    return _FIELD_OF_FLAG.get(setting, setting)


class ConfigError(ValueError):
    """A configuration value is invalid. ``setting`` names the flag or field at fault: a flag given here is named
    by its field outside a command (the data sources name ``--dataset``; a Python caller reads ``dataset``)."""

    def __init__(self, setting: str, message: str | None = None) -> None:
        if message is None:  # rebuilt from the message alone: "setting: message"
            setting, _, message = _own_line(type(self), setting).partition(": ")
        setting = _as_named(setting)
        self.setting = setting
        super().__init__(f"{setting}: {message}")


class StateMismatchError(ConfigError):
    """A saved state was made for other settings than the graph that is asked to restore it."""

    def __init__(self, node: str, setting: str, message: str) -> None:
        self.node = node
        self.setting = setting
        ValueError.__init__(self, f"{node}: {message}")


class SampleError(ValueError):
    """One sample cannot be processed, packed or exchanged. Names the sample and, if known, the field;
    ``kind`` says what is wrong with the dataset row, as :mod:`mimo_pipes.data.bad_rows` names it (None when
    unnamed, and after a hop through a worker, which rebuilds the error from its message)."""

    def __init__(self, sample_id: object, message: str | None = None, field: str | None = None, *, kind: str | None = None) -> None:
        if message is None and isinstance(sample_id, str):  # rebuilt from the message alone
            line = _own_line(type(self), sample_id)
            sample_id, field, message = _parse_sample_message(line) or (None, None, line)
        self.sample_id = sample_id
        self.field = field
        self.reason = message  # the message without where it happened
        self.kind = kind
        where = f"sample {sample_id!r}" + (f", field {field!r}" if field else "")
        super().__init__(f"{where}: {message}")


MAX_REASON = 300  # characters of a row's reason kept: a report line, not a traceback


def row_reason(error: SampleError) -> str:
    """What was wrong with a row, one line, without the "sample ..., field ...: dataset row N:" that says where."""
    text = " ".join(str(error.reason if error.reason is not None else error).split())
    text = text.removeprefix(f"dataset row {error.sample_id}: ")
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


class PeerError(RuntimeError):
    """A failure on another rank of the module (or a collective that timed out), raised on every rank."""

    def __init__(self, rank: int | None, message: str) -> None:
        self.rank = rank
        where = f"rank {rank}" if rank is not None else "a peer rank"
        super().__init__(f"{where} failed: {message}")


class LostPeerError(PeerError):
    """A collective of the library lost a peer (it exited, was killed, or stayed silent past the timeout), in one
    line: ``what`` was going on, the transport's ``cause`` in a few words, and the ``phrase`` naming the rank
    that is gone where the job's roll tells it (``rank`` when exactly one)."""

    def __init__(self, what: str, cause: str | None = None, phrase: str | None = None, rank: int | None = None) -> None:
        if cause is None:  # rebuilt from the message alone
            self.what, self.cause, self.phrase, self.rank = what, "", None, None
            RuntimeError.__init__(self, what)
            return
        self.what, self.cause, self.phrase, self.rank = what, cause, phrase, rank
        said = f"{what} failed: a peer rank exited or stopped answering ({cause})"
        RuntimeError.__init__(self, f"{said}; {phrase}" if phrase else said)


# The transport's causes, in the words a rank's line gives them (first match wins).
_CAUSES = (
    (re.compile(r"connection reset by peer", re.I), "connection reset by peer"),
    (re.compile(r"connection closed by peer|socket closed|end of file|EOF", re.I), "connection closed by peer"),
    (re.compile(r"broken pipe", re.I), "broken pipe"),
    (re.compile(r"connection refused", re.I), "connection refused"),
    (re.compile(r"NCCL communicator was aborted|remote process exited|NCCL error", re.I), "NCCL communicator aborted"),
    (re.compile(r"timed out|timeout", re.I), "timed out waiting for a peer"),  # last: the library's own messages say "timeout"
)
# Text that only a transport writes: a file of Gloo or NCCL, or torch's wrapping of their failures.
TRANSPORT = re.compile(r"gloo|pair\.cc|\.cc:\d+|NCCL|ProcessGroup|c10d|Connection reset|Connection closed|Broken pipe", re.I)


def lost_peer(error: BaseException) -> str | None:
    """The cause in a few words when ``error`` (or one it was raised from) is a transport's failure to reach a
    peer; None for any other error (a :class:`LostPeerError` gives its own cause). Plain text, no torch: the
    command line's parser imports it."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, LostPeerError):
            return current.cause
        text = str(current)
        if TRANSPORT.search(text):
            for pattern, cause in _CAUSES:
                if pattern.search(text):
                    return cause
        current = current.__cause__ or current.__context__
    return None


class ConsumedMismatchError(PeerError):
    """Ranks restored different consumed micro-batches (states of different saves, or of different steps):
    raised on every rank that compared them, naming each rank's. ``consumed``: global rank -> consumed micro-batches."""

    def __init__(self, consumed: dict[int, int]) -> None:
        self.rank = None
        self.consumed = dict(consumed)
        by_count: dict[int, list[int]] = {}
        for rank, count in sorted(self.consumed.items()):
            by_count.setdefault(count, []).append(rank)
        where = "; ".join(
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} at micro-batch {count}"
            for count, ranks in sorted(by_count.items(), key=lambda item: item[1][0])
        )
        RuntimeError.__init__(
            self, f"ranks restored different consumed micro-batches: {where}; their states come from different saves, and "
                  "every rank must restore the same one (the modules would pair the wrong samples)",
        )


PositionMismatchError = ConsumedMismatchError
"""The name :class:`ConsumedMismatchError` had before 0.2.0, kept for code that catches it."""


def json_error_text(error: ValueError, *, line: bool = True) -> str:
    """What a ``json.JSONDecodeError`` found and where, as one phrase: "Expecting value at line 3 column 15",
    "Unterminated string starting at column 4" (``line`` False: the caller names the line). Some of the
    decoder's messages end in "at" already ("... starting at", "Invalid control character at")."""
    message = getattr(error, "msg", str(error))
    where = f"line {getattr(error, 'lineno', '?')} column {getattr(error, 'colno', '?')}" if line else f"column {getattr(error, 'colno', '?')}"
    return f"{message} {where}" if message.endswith(" at") else f"{message} at {where}"


# ---- naming a setting, and counts: checked where they enter, refused in one line naming the setting ----------------

SETTING_NAMES = "MIMO_PIPES_SETTING_NAMES"
"""Environment variable: ``flags`` while a command runs (``mimo_pipes.config.flags.flag_names``), so errors name a
setting by its flag; otherwise by its field (what a Python caller wrote)."""


def setting_name(field: str, flag: str) -> str:
    """``flag`` inside a command, ``field`` otherwise (see :data:`SETTING_NAMES`)."""
    return flag if os.environ.get(SETTING_NAMES) == "flags" else field


def as_count(value: object, name: str, *, minimum: int | None = 0) -> int:
    """``value`` as an ``int`` >= ``minimum``; ConfigError naming ``name`` (the argument, field or flag) otherwise.
    ``minimum`` None checks the kind alone (a setting whose range its own check words).

    A count is an integer. Python's ``int``, numpy's integer scalars (``np.int64``) and a torch integer tensor of
    one element with no dimensions are the same count and come out as ``int``; ``bool`` (an ``int`` to Python, a
    flag to a person), floats (also ``6.0``: ``24 / 4`` gives a float, and a float position fails far from where
    it was given), strings and everything else are refused where they are given."""
    number = _integer(value)
    if number is None:
        wanted = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise ConfigError(name, f"must be {wanted}, got {value!r} ({_kind(value)})")
    if minimum is not None and number < minimum:
        raise ConfigError(name, f"must be an integer >= {minimum}, got {number}")
    return number


def _integer(value: object) -> int | None:
    """The integer ``value`` is, or None when it is not an integer (a bool is not)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):  # int and numpy's integer scalars (numpy's bool_ is not one)
        return int(value)
    torch = sys.modules.get("torch")  # a torch tensor exists only where torch is imported already
    if torch is not None and isinstance(value, torch.Tensor):
        integral = value.dim() == 0 and not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
        return int(value.item()) if integral else None
    return None


def _kind(value: object) -> str:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
