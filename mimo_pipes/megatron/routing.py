"""Where megatron-core's bridge sends an encoder's output rows: the routing rule as a pure function.

On an encoder rank of a non-colocated ``MimoModel`` the encoder returns one flat ``[image tokens, hidden]``
tensor for the rank's micro-batch (each sample's rows together, samples in micro-batch order). The model counts
each sample's placeholders in ``input_ids`` (one row per sample) and attaches those counts to the output when
there is more than one sample, they add up to the output's rows, and they are not all equal. The bridge then
cuts the output for the ``k`` language replicas it feeds: into ``k`` pieces of consecutive samples'
rows (``B / k`` samples each) when counts are attached, else into ``k`` nearly equal row ranges (which is the
same cut when every sample has as many rows). Piece ``j`` goes to the ``j``-th language replica it feeds.

The pipeline's pairing (an encoder rank's micro-batch is its language peers' micro-batches concatenated in
order) makes the attached cut exact: peer ``j`` gets the rows of exactly the samples it holds. Without
``input_ids`` on the encoder rank the equal cut would hand rows of one peer's images to another.
"""

from __future__ import annotations

from collections.abc import Sequence

from mimo_pipes.config.counts import as_count


def attached_split_sizes(placeholder_counts: Sequence[int], output_rows: int) -> list[int] | None:
    """The per-sample sizes an encoder rank's ``MimoModel`` attaches to an output of ``output_rows`` rows,
    given each sample's placeholder count (None: it attaches none)."""
    counts = [as_count(count, "placeholder_counts") for count in placeholder_counts]
    if len(counts) <= 1 or sum(counts) != output_rows or len(set(counts)) <= 1:
        return None
    return counts


def peer_row_counts(placeholder_counts: Sequence[int], output_rows: int, peers: int) -> list[int]:
    """The rows of an encoder rank's output each of its ``peers`` language replicas receives, in order.
    ValueError where the bridge would refuse the cut (sizes that do not group into ``peers`` pieces)."""
    peers, output_rows = as_count(peers, "peers", minimum=1), as_count(output_rows, "output_rows")
    if peers == 1:
        return [output_rows]
    sizes = attached_split_sizes(placeholder_counts, output_rows)
    if sizes is None:
        share, extra = divmod(output_rows, peers)
        return [share + (1 if peer < extra else 0) for peer in range(peers)]
    if len(sizes) > peers and len(sizes) % peers == 0:
        per_peer = len(sizes) // peers
        sizes = [sum(sizes[start : start + per_peer]) for start in range(0, len(sizes), per_peer)]
    if len(sizes) != peers:
        raise ValueError(f"{len(sizes)} per-sample sizes cannot be cut into {peers} pieces of whole samples")
    return sizes


def peer_sample_ranges(samples: int, peers: int) -> list[range]:
    """The samples (positions in the encoder rank's micro-batch) whose rows each peer receives: ``peers``
    consecutive groups of ``samples / peers`` (a ``[B, S, H]`` output is cut on ``B`` the same way)."""
    samples, peers = as_count(samples, "samples"), as_count(peers, "peers", minimum=1)
    if samples % peers:
        raise ValueError(f"{samples} samples cannot be cut into {peers} equal groups")
    per_peer = samples // peers
    return [range(peer * per_peer, (peer + 1) * per_peer) for peer in range(peers)]
