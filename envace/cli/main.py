"""The ``envace`` command line: one subcommand per pipeline stage (see ``envace --help``)."""

from __future__ import annotations

import argparse
import importlib
import sys

from envace import __version__
from envace.common.config import ConfigError
from envace.common.exit_codes import EXIT_FAILURE, EXIT_UNAVAILABLE, EXIT_USAGE
from envace.core.rollout import BackendError
from envace.serve.vllm_server import ServerError

#: modules under envace that define ``add_parser(subparsers)``; each parser sets ``func``.
COMMAND_MODULES = [
    "envace.report.aggregate_cmd",
    "envace.report.tables",
    "envace.report.figures",
    "envace.report.diff",
    "envace.report.html",
    "envace.cli.tiny_model",
    "envace.cli.fidelity",
    "envace.cli.eval",
    "envace.cli.serve",
    "envace.cli.selfcheck",
    "envace.cli.train",
    "envace.cli.data",
    "envace.cli.plan",
    "envace.cli.ledger",
]


#: the exit statuses of ``envace`` (the epilog of ``envace --help``; docs/user_guide.md, "Exit codes").
EXIT_CODES = """\
exit codes:
  0      success
  1      failure: an error envace reports ("envace COMMAND: error: ..."; a bad config, a missing file
         or model, an invalid value), a self-check with unexplained failures, an incomplete
         evaluation (aggregate), OUTSIDE_CI cells or REFUTED claims (diff --strict), training that
         wrote no new checkpoint or stopped before total_steps, or a run that cannot be launched as
         configured (train), an unexpected exception
  2      usage error (argparse's own; also no command given)
  3      unavailable resource: a model server that failed to start, died or stopped answering (eval,
         serve, fidelity; finished samples are kept), a self-check whose benchmark package is missing,
         a training driver that logged nothing for training.step_timeout_min (train; stopped, a
         retry resumes from the last checkpoint)
  4      unusable input: a results directory that does not exist, a corrupt result file, a manifest
         of another config (tables, figures, aggregate, diff); missing training data (train)
  128+N  stopped by signal N (SIGTERM 143, SIGHUP 129; eval, serve and fidelity stop their servers
         first); 130 = interrupted (Ctrl-C)
  train passes on any other non-zero status of verl's main_ppo as it is.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="envace", description=__doc__, epilog=EXIT_CODES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"envace {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def run(argv: list[str]) -> int:
    """Run one command; its exceptions propagate (tests call this; :func:`main` reports them)."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except (ServerError, BackendError) as exc:
        print(f"envace {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"envace {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
