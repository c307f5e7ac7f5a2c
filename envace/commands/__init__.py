"""Subcommands of the ``envace`` CLI. Each module exposes ``add_parser(subparsers)`` and ``run(args)``."""
