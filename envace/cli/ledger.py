"""``envace ledger-records``: the ledger benchmark's reference records (CM2's labelled layout) as JSONL.

The ledger (:mod:`envace.bench.ledger`, ours) generates its tasks from ``benchmarks.ledger`` (``seed``,
``n_train``, ``n_test``; the adapter's defaults when the config has no such entry). This command writes
one split's reference records — what ``envace data`` and a ``tiny_model.warmstart`` stage read —
so the records a model trains on are the tasks the evaluation's other split is disjoint from.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envace.common.config import DEFAULT_CONFIG


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ledger-records", help="write the ledger benchmark's reference records")
    p.add_argument("--config", default=DEFAULT_CONFIG,
                   help="experiment config (benchmarks.ledger: seed, n_train, n_test) (default: %(default)s)")
    p.add_argument("--split", choices=["train", "test", "world"], default="train",
                   help="which split (default train); world: the train tasks' world records (REHEARSE "
                        "warm-start data: a get_balance probe of every account, "
                        "envace.bench.ledger.world_records)")
    p.add_argument("--out", required=True, help="JSONL output (written atomically)")
    p.set_defaults(func=run, command_name="ledger-records")


def run(args: argparse.Namespace) -> int:
    from envace.bench.ledger import LedgerAdapter, write_records
    from envace.common.config import load_config

    cfg = load_config(args.config)
    adapter = LedgerAdapter(cfg.get("benchmarks", {}).get("ledger"))  # the benchmark entry (its ledger: key)
    world = args.split == "world"
    tasks = [t.meta["ledger_task"] for t in adapter.load_tasks(["train" if world else args.split], None)]
    write_records(tasks, Path(args.out), world=world)
    what = f"world records of {len(tasks)} train tasks" if world else f"{len(tasks)} {args.split} records"
    print(f"ledger-records: {what} -> {args.out} ({adapter.versions()['ledger']})", file=sys.stderr)
    return 0
