"""Check the smoke DAG's training runs: each trained with verl's ``main_ppo`` (its own step lines in the
run's log, at least 3), the EnvACE runs' batches held ACT and REHEARSE rows, rewards were not all
equal and some trajectory earned a positive reward (a spread made only of the -0.1 blank-row penalty,
with every episode ending at its first malformed rehearsal, fails). Prints each run's episode endings
(``envace/termination/*``). Reads the rule logs (``<results>/logs/train/<run>.log``) and verl's metrics
(``<checkpoints>/<run>/metrics.jsonl``). Exit 1 with the reasons if a check fails.

Usage: ``python benchmarks/check_smoke_training.py results/smoke checkpoints/smoke``
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

STEP = re.compile(r"step:(\d+) - ")


def check(results: Path, checkpoints: Path) -> list[str]:
    problems = []
    logs = sorted((results / "logs" / "train").glob("*.log"))
    if not logs:
        return [f"no training logs in {results / 'logs' / 'train'}"]
    for log in logs:
        run = log.stem
        steps = sorted({int(m) for m in STEP.findall(log.read_text(errors="replace"))})
        metrics_file = checkpoints / run / "metrics.jsonl"
        lines = metrics_file.read_text().splitlines() if metrics_file.is_file() else []
        rows = [json.loads(x)["data"] for x in lines]
        rehearse = sum(float(r.get("envace/rows/rehearse", 0)) for r in rows)
        act = sum(float(r.get("envace/rows/act", 0)) for r in rows)
        spread = max((float(r["critic/score/max"]) - float(r["critic/score/min"]) for r in rows), default=0.0)
        best = max((float(r["critic/score/max"]) for r in rows), default=0.0)
        ends = {k.removeprefix("envace/termination/"): sum(float(r.get(k, 0)) for r in rows) / len(rows)
                for k in sorted({k for r in rows for k in r if k.startswith("envace/termination/")})}
        print(f"{run}: verl step lines {steps or 'none'}; rows ACT {act:.0f} REHEARSE {rehearse:.0f}; "
              f"largest in-batch reward spread {spread:.3f}; best reward {best:.3f}; episode ends "
              + (", ".join(f"{k} {v:.0%}" for k, v in ends.items()) or "not logged"))
        if len(steps) < 3:
            problems.append(f"{run}: {len(steps)} verl step lines in {log} (want >= 3)")
        if not rows:
            problems.append(f"{run}: no metrics in {metrics_file}")
        if act == 0:
            problems.append(f"{run}: no ACT rows")
        if not run.startswith("grpo") and rehearse == 0:
            problems.append(f"{run}: no REHEARSE rows")
        if spread <= 0:
            problems.append(f"{run}: every reward equal in every batch")
        if best <= 0:
            problems.append(f"{run}: no trajectory earned a positive reward")
    return problems


def main() -> int:
    results, checkpoints = (Path(a) for a in sys.argv[1:3])
    problems = check(results, checkpoints)
    for p in problems:
        print("FAIL:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
