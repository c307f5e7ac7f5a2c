"""Smoke DAG timing: wall time, a per-rule time table, and harness vs model time in evaluations.

Reads what a finished smoke run leaves behind — Snakemake's per-job benchmark files
(``<results>/benchmarks/<rule>/...tsv``, written by every rule's ``benchmark:``), the ``timing`` of the
evaluation manifests (wall time of the sample loops; CPU seconds of the model servers vs of the
``envace eval`` processes: model compute vs harness) and their ``serving`` records (the number of
``vllm serve`` starts and their start-up times, counted once per job) — and prints Markdown tables.
With ``--run`` it first
runs the smoke DAG from scratch (``make clean-smoke``, then ``make smoke``) and reports its wall time.

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


def model_share(results: Path) -> dict[str, float]:
    """Sums of the ``timing`` fields over evaluation and TTS manifests (``files``: how many had one).

    The CPU fields (``server_cpu_s``, ``process_cpu_s``) are a job's running totals when each of its
    manifests was written: per job (``serving.job``) only the largest counts."""
    sums: dict[str, float] = defaultdict(float)
    cpu: dict[str, dict[str, float]] = defaultdict(dict)
    for manifest in list((results / "eval").rglob("*.manifest.json")) + list(
            (results / "tts").rglob("*.manifest.json")):
        doc = json.loads(manifest.read_text())
        timing = doc.get("timing")
        if timing:
            sums["files"] += 1
            job = (doc.get("serving") or {}).get("job", str(manifest))
            for key, value in timing.items():
                if key.endswith("cpu_s"):
                    cpu[job][key] = max(cpu[job].get(key, 0.0), float(value))
                else:
                    sums[key] += float(value)
    for per_job in cpu.values():
        for key, value in per_job.items():
            sums[key] += value
    return sums


def server_starts(results: Path) -> tuple[int, int, list[float]]:
    """``(jobs, model-server starts, start-up seconds of each)`` from the ``serving`` records of the
    evaluation / TTS manifests (one job id per ``envace eval`` job, shared by its manifests) and of the
    fidelity documents (one job each, or the evaluation job's). A job's manifests each list the servers
    their runs used (a server shared by several runs appears in each, under the same ``index``): a job's
    servers are their union."""
    jobs: dict[str, dict] = {}
    for manifest in list((results / "eval").rglob("*.manifest.json")) + list(
            (results / "tts").rglob("*.manifest.json")):
        if ".done" in manifest.parts:
            continue
        serving = json.loads(manifest.read_text()).get("serving")
        if serving:
            job = jobs.setdefault(serving["job"], {})
            for i, srv in enumerate(serving["servers"]):
                job.setdefault(srv.get("index", i), srv)
    for doc in (results / "fidelity").rglob("*.json"):
        serving = json.loads(doc.read_text()).get("serving")
        if serving:  # its own job (rule fidelity), or the evaluation job's (evaluation.one_job)
            job = jobs.setdefault(serving.get("job", str(doc)), {})
            for i, srv in enumerate(serving["servers"]):
                job.setdefault(srv.get("index", i), srv)
    servers = [srv for group in jobs.values() for srv in group.values()]
    starts = sum(int(srv.get("launches", 1)) for srv in servers)
    return len(jobs), starts, [float(srv["ready_s"]) for srv in servers]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="run `make clean-smoke smoke` first and time it")
    parser.add_argument("--results", default="results/smoke", help="results root of the smoke config")
    args = parser.parse_args(argv)
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
    jobs, starts, ready = server_starts(results)
    if jobs:
        ready.sort()
        print(f"\nmodel servers (`vllm serve`): {starts} starts in {jobs} jobs; start-up to healthy "
              f"median {ready[len(ready) // 2]:.0f} s, max {ready[-1]:.0f} s, {sum(ready):.0f} s in all.")
    t = model_share(results)
    if t.get("files"):
        eval_jobs = sum(total for rule, _, total, _, _ in table
                        if rule.startswith("evaluate") or rule == "tts_evaluate")
        print(f"\nevaluation + TTS jobs ({t['files']:.0f} result files): {eval_jobs:.0f} s wall in all, of "
              f"which {t['wall_s']:.0f} s in the sample loops (the rest: process start, imports, server "
              "start).")
        if "server_cpu_s" in t:
            cpu = t["server_cpu_s"] + t["process_cpu_s"]
            print(f"CPU time: model servers (model, user simulator, rehearser) {t['server_cpu_s']:.0f} s "
                  f"({t['server_cpu_s'] / cpu:.0%}); the envace eval processes (harness, benchmark "
                  f"environments, imports) {t['process_cpu_s']:.0f} s ({t['process_cpu_s'] / cpu:.0%}).")


if __name__ == "__main__":
    main()
