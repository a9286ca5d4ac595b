"""Window planning: a window's micro-batches balanced where they stand or with samples moving between them
(``planner``), with two levels (``two_level``), or as a given composition (``given_composition``)."""
