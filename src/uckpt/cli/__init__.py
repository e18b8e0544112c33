"""The ``uckpt`` command-line tool (entry point: :func:`uckpt.cli.main.main`)."""
