"""Exact searches on counted budgets: the slots of one micro-batch (``exact``), and the plans of a window
whose samples may cross micro-batches: over labelled micro-batches (``window_search``), over unlabelled bins
(``bin_search``) and over counts of each cost (``count_search``)."""
