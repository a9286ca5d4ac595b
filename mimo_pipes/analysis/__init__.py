"""What reordering would do, offline: per-sample token counts, a replay of the canonical grid, tables, plots.

Used by ``mimo-pipes analyze``; one process, no collectives. The replay calls the same pure functions
the graph uses (sharding, window alignment, the exchange's planner), so its figures match a real run.
"""
