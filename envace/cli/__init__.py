"""Layer 6, the ``envace`` command line (:mod:`.main`) and its pipeline-stage subcommands. Each module
exposes ``add_parser(subparsers)`` and ``run(args)``; the report's subcommands live in
:mod:`envace.report`. Exit statuses: :data:`envace.cli.main.EXIT_CODES`."""

#: a command that ran and failed (the message names why)
EXIT_FAILURE = 1
#: a usage error, or results/inputs a command cannot use (corrupt, missing, of another config)
EXIT_USAGE = 2
#: a resource the command needs is unavailable: a model server that does not start, dies or stops
#: answering; a benchmark package that is not installed
EXIT_UNAVAILABLE = 3
