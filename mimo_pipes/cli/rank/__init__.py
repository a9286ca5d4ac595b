"""What every rank of ``run`` and ``train`` runs: its body (``run_rank.py``, ``train_rank.py``) and what goes
around its loop (groups and layout, the dump, the progress bar, the collective save, stopping on a signal, its
report to rank 0)."""
