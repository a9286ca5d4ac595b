"""mimo-pipes: balanced, checkpointable torchdata.nodes pipelines for non-colocated MIMO training."""

__version__ = "0.1.0"

from mimo_pipes.observe.third_party import quiet_known_warnings as _quiet_known_warnings  # noqa: E402 - after the version

_quiet_known_warnings()
