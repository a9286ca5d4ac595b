"""The ``mimo-pipes`` command line: ``main.py`` dispatches to ``commands/``; ``job/`` is what a job does before its
ranks start, ``rank/`` what every rank runs."""
