"""The ``envace`` command line: one subcommand per pipeline stage (see ``envace --help``)."""

from __future__ import annotations

import argparse
import importlib
import sys

from envace import __version__
from envace.config import ConfigError

#: modules under envace that define ``add_parser(subparsers)``; each parser sets ``func``.
COMMAND_MODULES = [
    "envace.report.aggregate_cmd",
    "envace.report.tables",
    "envace.report.figures",
    "envace.report.diff",
    "envace.report.html",
    "envace.commands.tiny_model",
    "envace.commands.fidelity",
    "envace.commands.eval",
    "envace.commands.serve",
    "envace.commands.selfcheck",
    "envace.commands.train",
    "envace.commands.data",
    "envace.commands.plan",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="envace", description=__doc__)
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
        return 2
    try:
        return int(args.func(args) or 0)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"envace {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
