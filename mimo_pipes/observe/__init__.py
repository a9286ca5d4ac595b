"""What a job tells its user: the exchange's per-window records and metrics (``observer``, ``metrics``,
``tensorboard_sink``), the run summary (``summary``), warnings counted once (``warning_tally``) and other
libraries' noise kept off the terminal (``third_party``)."""
