"""``benchmarks/bench_aggregate.py`` at a few tasks: every stage runs and its synthetic FinMCP lines are
what the report's micro average reads."""

from __future__ import annotations

import math
import re

import pytest

from envace.bench.finmcp import aggregate_metrics, sample_metrics, tool_counts
from envace.common.results import eval_path, read_results
from envace.report.evaluations import load_evaluation


def test_quick_run_times_every_stage(script, capsys) -> None:
    bench = script("bench_aggregate")
    bench.main(["--resamples", "20", "--tasks", "12"])
    out = capsys.readouterr().out
    n_files = bench.N_MODELS * len(bench.BENCHMARKS) * len(bench.SEEDS)
    assert f"write {n_files} result files:" in out
    seconds = [float(x) for x in re.findall(r": (\S+) s$", out, re.MULTILINE)]
    assert len(seconds) == 5 and all(math.isfinite(s) and s >= 0 for s in seconds), out


def test_finmcp_lines_hold_the_counts_of_the_micro_average(script, tmp_path) -> None:
    bench = script("bench_aggregate")
    cfg = bench.synthetic_config()
    bench.write_set(cfg, tmp_path, 12)
    model = next(iter(cfg["models"]))
    counts = []
    for seed in bench.SEEDS:
        for line in read_results(eval_path(tmp_path, model, "finmcp", seed)).lines:
            extra = line["extra"]
            pred, gold = extra["pred_tools"], extra["gold_tools"]
            assert (extra["TP"], extra["FP"], extra["FN"]) == tool_counts(pred, gold)
            assert line["subscores"] == sample_metrics(pred, gold)
            assert line["score"] == line["subscores"]["tf1"]
            counts.append((extra["TP"], extra["FP"], extra["FN"]))
    evaluation = load_evaluation(cfg, tmp_path, "eval", model, "finmcp")
    micro = aggregate_metrics(counts)["micro_tf1"]
    assert evaluation.average == "micro" and 0 < micro < 1
    assert evaluation.group_means() == {"all": pytest.approx(micro)}
