"""Benchmark of the reporting pipeline at paper scale (a script, not a test).

Builds a synthetic result set — 11 models x 4 benchmarks (bfcl_v4, tau2, vitabench, finmcp) x 4 runs x
1,000 tasks, one sample per task and run — with :func:`envace.common.results.write_results` in a temporary
directory, then times separately: reading and checking every file into task x run matrices
(:func:`envace.report.evaluations.load_evaluation`), and the bootstrap of all 44 (model, benchmark) cells
plus the 11 benchmark-stratified Table 1 Overall cells with 10,000 resamples each.

Usage: ``python benchmarks/bench_aggregate.py [--resamples 10000] [--tasks 1000]``
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import numpy as np

from envace.common.config import eval_hash, load_config
from envace.common.results import eval_path, write_results
from envace.common.stats import bootstrap_mean, bootstrap_stratified_mean
from envace.report.evaluations import load_evaluation

CONFIG = Path(__file__).resolve().parents[1] / "tests" / "data" / "example_config.yaml"
N_MODELS = 11
BENCHMARKS = ("bfcl_v4", "tau2", "vitabench", "finmcp")
SEEDS = (0, 1, 2, 3)


def synthetic_config() -> dict:
    cfg = copy.deepcopy(load_config(CONFIG))
    cfg["seeds"] = list(SEEDS)
    cfg["models"] = {
        f"model_{i:02d}": {"label": f"Model-{i}", "kind": "tiny", "path": "x"} for i in range(N_MODELS)
    }
    return cfg


def write_set(cfg: dict, root: Path, n_tasks: int) -> None:
    rng = np.random.default_rng(0)
    for model in cfg["models"]:
        skill = rng.uniform(0.1, 0.6)
        for bench in BENCHMARKS:
            splits = cfg["benchmarks"][bench]["splits"]
            fin = bench == "finmcp"
            difficulty = rng.beta(2, 2, n_tasks)
            for seed in SEEDS:
                scores = (rng.random(n_tasks) < np.clip(skill + 0.5 - difficulty, 0, 1)).astype(float)
                lines = [
                    {
                        "benchmark": bench,
                        "split": splits[t % len(splits)],
                        "task_id": f"t{t:05d}",
                        "sample": 0,
                        "seed": seed,
                        "score": float(s),
                        "subscores": {"tp": float(s), "tr": float(s), "tf1": float(s)} if fin else {},
                        "status": "ok",
                        "reason": None,
                    }
                    for t, s in enumerate(scores)
                ]
                write_results(
                    eval_path(root, model, bench, seed),
                    lines,
                    model=model,
                    benchmark=bench,
                    seed=seed,
                    scale=cfg["scale"],
                    config_hash=eval_hash(cfg, model, bench),
                    git_commit="bench",
                    package_versions={},
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--tasks", type=int, default=1000)
    args = parser.parse_args()
    cfg = synthetic_config()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        write_set(cfg, root, args.tasks)
        t1 = time.perf_counter()
        evals = {(m, b): load_evaluation(cfg, root, "eval", m, b) for m in cfg["models"] for b in BENCHMARKS}
        t2 = time.perf_counter()
    boot = {"resamples": args.resamples, "seed": 12345}
    for ev in evals.values():
        bootstrap_mean(ev.matrix, **boot)
    t3 = time.perf_counter()
    for model in cfg["models"]:
        bootstrap_stratified_mean([evals[(model, b)].matrix for b in BENCHMARKS[:3]], **boot)
    t4 = time.perf_counter()
    n_files = len(evals) * len(SEEDS)
    print(
        f"bench_aggregate: {N_MODELS} models x {len(BENCHMARKS)} benchmarks x {len(SEEDS)} runs x "
        f"{args.tasks} tasks, {args.resamples} resamples\n"
        f"  write {n_files} result files: {t1 - t0:.1f} s\n"
        f"  read + check into matrices: {t2 - t1:.1f} s\n"
        f"  bootstrap {len(evals)} cells: {t3 - t2:.1f} s\n"
        f"  bootstrap {N_MODELS} stratified Overall cells: {t4 - t3:.1f} s\n"
        f"  bootstrap total: {t4 - t2:.1f} s"
    )


if __name__ == "__main__":
    main()
