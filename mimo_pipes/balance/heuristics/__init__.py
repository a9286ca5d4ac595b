"""Heuristics for one micro-batch: starts (contiguous, LPT, Karmarkar-Karp, best fit) and improvements
(swap refinement, exact re-partitions of three slots). Each works in rank space (see ``canonical``)."""
