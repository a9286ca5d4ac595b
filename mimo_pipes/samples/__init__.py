"""What flows through the graph and how it is shaped: the sample and window types (``sample``), each module's
fields (``module_fields``), per-sample costs (``cost``, ``cost_range``), what a sample must be before it is exchanged (``checks``),
collation (``collate``) and sequence
packing (``thd``). Pure functions: no graph, no collectives."""
