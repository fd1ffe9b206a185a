"""The ``eqsat-mirage`` command: demo, optimize, verify, check-rules, targets, cache, bench.

``parser.py``: the argument parser and exit statuses. ``main.py``: the subcommands.

Takes: command-line arguments and program files.
Gives: reports on stdout, progress on stderr, an exit status.
May import: every stage before it.
"""
