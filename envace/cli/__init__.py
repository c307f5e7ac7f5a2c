"""Layer 6, the ``envace`` command line (:mod:`.main`) and its pipeline-stage subcommands. Each module
exposes ``add_parser(subparsers)`` and ``run(args)``; the report's subcommands live in
:mod:`envace.report`. Exit statuses: :mod:`envace.common.exit_codes`."""
