"""``envace selfcheck <name>``: gold replays through the full evaluation runner; prints ``passed/total``.

``bfcl_multi_turn``: :func:`envace.bench.selfcheck.selfcheck_bfcl_multi_turn` (must be 800/800).
``tau2``: ``envace.bench.tau2.selfcheck_tau2`` (owned by the tau^2 adapter; must be 278/278).
Exit code 0 only if every task passed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

CHECKS = {
    "bfcl_multi_turn": "envace.bench.selfcheck:selfcheck_bfcl_multi_turn",
    "tau2": "envace.bench.tau2:selfcheck_tau2",
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("selfcheck", help="gold replay through the full runner; prints passed/total")
    p.add_argument("name", choices=sorted(CHECKS))
    p.add_argument("--limit", type=int, help="tasks per split (default: all)")
    p.add_argument("--show-failures", type=int, default=10, help="print up to this many failed samples")
    p.set_defaults(func=run, command_name="selfcheck")


def run(args: argparse.Namespace) -> int:
    module, _, func = CHECKS[args.name].partition(":")
    try:
        check = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        print(f"envace selfcheck: error: {args.name} is not available: {exc}", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    passed, total, failed = check(limit=args.limit)
    elapsed = time.perf_counter() - t0
    for line in failed[: args.show_failures]:
        print(f"FAILED {line['task_id']}: {line.get('reason') or line.get('extra')}", file=sys.stderr)
    print(f"{passed}/{total}")
    print(f"selfcheck {args.name}: {elapsed:.1f} s", file=sys.stderr)
    return 0 if passed == total and total > 0 else 1
