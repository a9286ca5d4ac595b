"""A job before its ranks start: the flags ``run``, ``analyze`` and ``train`` share and the options they make,
what a recipe provides, the checks made once, and the launcher that starts the ranks."""
