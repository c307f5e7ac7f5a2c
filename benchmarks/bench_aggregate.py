"""Benchmark of the reporting pipeline at paper scale (a script, not a test).

Builds a synthetic result set — 11 models x 4 benchmarks (bfcl_v4, tau2, vitabench, finmcp) x 4 runs x
1,000 tasks, one sample per task and run — with :func:`envace.common.results.write_results` in a temporary
directory (FinMCP lines as :class:`envace.bench.finmcp.FinMcpEpisode` scores them: tool-name counts TP / FP /
FN in ``extra``, ``tp`` / ``tr`` / ``tf1`` derived from them, score ``tf1``; the report's micro average
reads the counts), then times separately: reading and checking every file into task x run matrices
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

from envace.bench.finmcp import sample_metrics, tool_counts
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


def finmcp_sample(rng: np.random.Generator, n_gold: int, p: float) -> dict:
    """``score``, ``subscores`` and ``extra`` of one FinMCP sample: the agent calls each of the ``n_gold``
    gold tools with probability ``p`` and makes up to two calls of a tool outside the gold list."""
    gold = [f"tool_{i}" for i in range(n_gold)]
    pred = [name for name in gold if rng.random() < p] + ["other_tool"] * int(rng.binomial(2, 1 - p))
    tp, fp, fn = tool_counts(pred, gold)
    metrics = sample_metrics(pred, gold)
    return {"score": metrics["tf1"], "subscores": metrics,
            "extra": {"TP": tp, "FP": fp, "FN": fn, "pred_tools": pred, "gold_tools": gold}}


def write_set(cfg: dict, root: Path, n_tasks: int) -> None:
    """Every (model, benchmark, seed) result file of ``cfg`` under ``root``, ``n_tasks`` tasks each."""
    rng = np.random.default_rng(0)
    for model in cfg["models"]:
        skill = rng.uniform(0.1, 0.6)
        for bench in BENCHMARKS:
            splits = cfg["benchmarks"][bench]["splits"]
            difficulty = rng.beta(2, 2, n_tasks)
            n_gold = rng.integers(1, 7, n_tasks)  # FinMCP: gold tool calls of each task
            p = np.clip(skill + 0.5 - difficulty, 0, 1)
            for seed in SEEDS:
                if bench == "finmcp":
                    samples = [finmcp_sample(rng, int(n_gold[t]), float(p[t])) for t in range(n_tasks)]
                else:
                    samples = [{"score": float(s), "subscores": {}} for s in rng.random(n_tasks) < p]
                lines = [
                    {
                        "benchmark": bench,
                        "split": splits[t % len(splits)],
                        "task_id": f"t{t:05d}",
                        "sample": 0,
                        "seed": seed,
                        "status": "ok",
                        "reason": None,
                        **sample,
                    }
                    for t, sample in enumerate(samples)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--tasks", type=int, default=1000)
    args = parser.parse_args(argv)
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
