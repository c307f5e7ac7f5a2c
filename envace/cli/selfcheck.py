"""``envace selfcheck <name>``: gold replays through the full evaluation runner; prints ``passed/total``.

``bfcl_multi_turn``: :func:`envace.bench.selfcheck.selfcheck_bfcl_multi_turn` (must be 800/800).
``bfcl_ast``: :func:`envace.bench.selfcheck.selfcheck_bfcl_ast` (the 13 single-turn categories; also
prints ``category: passed/total`` per category). Expected 3635/3641: no output meets bfcl-eval's own
ground truth for 6 tasks (``envace.bench.bfcl.single_turn.KNOWN_UNSATISFIABLE``); their failed lines carry
``known_unsatisfiable`` and are reported as known.
``bfcl_agentic``: :func:`envace.bench.selfcheck.selfcheck_bfcl_agentic` (memory_kv/vector/rec_sum with
their prerequisite conversations, web_search_base/no_snippet from a cache built from bfcl-eval's ground
truth; prints ``category: passed/total``).
``tau2``: ``envace.bench.tau2.gold.selfcheck_tau2`` (owned by the tau^2 adapter; must be 278/278).
``ledger``: :func:`envace.bench.selfcheck.selfcheck_ledger` (our smoke benchmark; must be 96/96).
A check may return a fourth value, ``{category: (passed, total)}``, printed one line per category.
Exit code 0 only if every task passed, except failed lines marked ``known_unsatisfiable``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from envace.common.exit_codes import EXIT_UNAVAILABLE

CHECKS = {
    "bfcl_multi_turn": "envace.bench.selfcheck:selfcheck_bfcl_multi_turn",
    "bfcl_ast": "envace.bench.selfcheck:selfcheck_bfcl_ast",
    "bfcl_agentic": "envace.bench.selfcheck:selfcheck_bfcl_agentic",
    "tau2": "envace.bench.tau2.gold:selfcheck_tau2",
    "ledger": "envace.bench.selfcheck:selfcheck_ledger",
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("selfcheck", help="gold replay through the full runner; prints passed/total")
    p.add_argument("name", choices=sorted(CHECKS), help="which benchmark's gold replay")
    p.add_argument("--limit", type=int, help="tasks per split (default: all)")
    p.add_argument("--show-failures", type=int, default=10, help="print up to this many failed samples")
    p.set_defaults(func=run, command_name="selfcheck")


def run(args: argparse.Namespace) -> int:
    module, _, func = CHECKS[args.name].partition(":")
    try:
        check = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        print(f"envace selfcheck: error: {args.name} is not available: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    t0 = time.perf_counter()
    passed, total, failed, *rest = check(limit=args.limit)
    elapsed = time.perf_counter() - t0
    unexplained = [line for line in failed if not line.get("known_unsatisfiable")]
    for line in unexplained[: args.show_failures]:
        print(f"FAILED {line['task_id']}: {line.get('reason') or line.get('extra')}", file=sys.stderr)
    for line in failed:
        if line.get("known_unsatisfiable"):
            print(f"known {line['task_id']}: {line['known_unsatisfiable']}", file=sys.stderr)
    for split, (ok, n) in (rest[0] if rest else {}).items():
        print(f"{split}: {ok}/{n}")
    print(f"{passed}/{total}")
    print(f"selfcheck {args.name}: {elapsed:.1f} s", file=sys.stderr)
    return 0 if total > 0 and not unexplained else 1
