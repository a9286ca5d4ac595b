"""mimo-pipes: balanced, checkpointable torchdata.nodes pipelines for non-colocated MIMO training."""

__version__ = "0.1.0"
