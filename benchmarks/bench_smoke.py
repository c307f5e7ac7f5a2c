"""Smoke DAG timing: wall time, a per-rule time table, and harness vs model time in evaluations.

Reads what a finished smoke run leaves behind — Snakemake's per-job benchmark files
(``<results>/benchmarks/<rule>/...tsv``, written by every rule's ``benchmark:``) and the ``timing`` of the
evaluation manifests (``wall_s``, ``model_s``) — and prints Markdown tables. With ``--run`` it first runs
the smoke DAG from scratch (``make clean-smoke``, then ``make smoke``) and reports its wall time.

Usage:
    .venv/bin/python benchmarks/bench_smoke.py [--run] [--results results/smoke]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rule_table(results: Path) -> tuple[list[tuple[str, int, float, float, float]], float]:
    """``(rule, jobs, total s, mean s, max s)`` per rule, slowest total first, and the sum of all jobs."""
    per_rule: dict[str, list[float]] = defaultdict(list)
    for tsv in sorted((results / "benchmarks").rglob("*.tsv")):
        rule = tsv.relative_to(results / "benchmarks").parts[0].removesuffix(".tsv")
        with open(tsv, newline="") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if rows:
            per_rule[rule].append(float(rows[-1]["s"]))
    table = [(r, len(v), sum(v), sum(v) / len(v), max(v)) for r, v in per_rule.items()]
    table.sort(key=lambda row: -row[2])
    return table, sum(row[2] for row in table)


def model_share(results: Path) -> tuple[int, float, float]:
    """``(result files, runner wall s, model s)`` over evaluation and TTS manifests with ``timing``."""
    files, wall, model = 0, 0.0, 0.0
    for manifest in list((results / "eval").rglob("*.manifest.json")) + list(
            (results / "tts").rglob("*.manifest.json")):
        timing = json.loads(manifest.read_text()).get("timing")
        if timing:
            files += 1
            wall += float(timing["wall_s"])
            model += float(timing["model_s"])
    return files, wall, model


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="run `make clean-smoke smoke` first and time it")
    parser.add_argument("--results", default="results/smoke", help="results root of the smoke config")
    args = parser.parse_args()
    if args.run:
        subprocess.run(["make", "clean-smoke"], cwd=ROOT, check=True, capture_output=True)
        start = time.perf_counter()
        subprocess.run(["make", "smoke"], cwd=ROOT, check=True)
        print(f"\nsmoke DAG wall time: {time.perf_counter() - start:.0f} s")
    results = ROOT / args.results
    table, job_s = rule_table(results)
    if not table:
        raise SystemExit(f"no benchmark files under {results}/benchmarks: run the smoke DAG first (--run)")
    print("\n| rule | jobs | total s | mean s | max s | share of job time |")
    print("|---|---:|---:|---:|---:|---:|")
    for rule, jobs, total, mean, worst in table:
        print(f"| {rule} | {jobs} | {total:.0f} | {mean:.1f} | {worst:.1f} | {total / job_s:.0%} |")
    print(f"| all | {sum(r[1] for r in table)} | {job_s:.0f} | | | 100% |")
    files, wall, model = model_share(results)
    if files:
        eval_jobs = sum(total for rule, _, total, _, _ in table if rule in ("evaluate", "tts_evaluate"))
        print(f"\nevaluation jobs ({files} result files): {eval_jobs:.0f} s in all; the sample loop "
              f"{wall:.0f} s, of which {model:.0f} s ({model / wall:.0%}) inside the model backend and "
              f"{wall - model:.0f} s ({(wall - model) / wall:.0%}) in harness, benchmark environments and "
              f"helper servers (user simulator); the remaining {eval_jobs - wall:.0f} s are process start, "
              "imports and model-server start-up.")


if __name__ == "__main__":
    main()
