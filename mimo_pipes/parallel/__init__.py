"""Parallel layout arithmetic, no torch.distributed: module specs, the canonical grid and rank placement
(``topology``), and which dataset rows each DP rank reads (``sharding``)."""
