"""The graph's tail and its loader: the settings resolved once (``tail_settings``), the nodes appended after
any source (``tail``), and the torchdata Loader that saves and restores the whole graph (``loader``)."""
