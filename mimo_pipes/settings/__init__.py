"""Settings resolved once: every balancing setting of a graph's tail as one frozen object (``tail_settings``),
below the nodes that take it."""
