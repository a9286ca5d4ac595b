"""One module per subcommand (``run_cmd.py`` is ``mimo-pipes run``), and the argument types and help convention
their parsers share."""
