"""Metric rules that follow the paper / the pinned benchmark package.

* FinMCP TF1: the paper's TF1 is the F1 of aggregated (micro) precision and recall; macro beside it.
* BFCL-v4 groups and Overall: computed as the pinned bfcl-eval's own leaderboard code computes them,
  checked by feeding the same per-category scores to bfcl-eval's ``generate_leaderboard_csv`` (without
  and with the agentic categories), and the ``aggregate.overall`` switch and Overall label on them.
"""

from __future__ import annotations

import copy
import importlib
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envace.bench.bfcl import common as bfcl_common
from envace.bench.bfcl import leaderboard as bfcl
from envace.bench.finmcp import MICRO_METRICS, aggregate_metrics
from envace.common.config import eval_hash, load_config
from envace.common.results import IncompleteResultsError, eval_path, write_results
from envace.common.stats import RatioMatrix, TaskMatrix, bootstrap_mean
from envace.report.aggregate_cmd import summarize
from envace.report.context import ReportContext
from envace.report.evaluations import describe_overall, load_evaluation

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE_CONFIG = ROOT / "tests" / "data" / "example_config.yaml"


def _write(cfg: dict[str, Any], root: Path, model: str, bench: str, rows: list[dict[str, Any]]) -> None:
    """One result file per configured seed holding ``rows`` (split, task_id, score, ...)."""
    for seed in cfg["seeds"]:
        lines = [
            {"benchmark": bench, "sample": 0, "seed": seed, "subscores": {}, "status": "ok", "reason": None,
             **row}
            for row in rows
        ]
        write_results(eval_path(root, model, bench, seed), lines, model=model, benchmark=bench, seed=seed,
                      scale=cfg["scale"], config_hash=eval_hash(cfg, model, bench), git_commit="test",
                      package_versions={})


# --- FinMCP: micro TP / TR / TF1 --------------------------------------------------------------------


def test_micro_tf1_of_the_papers_tp_and_tr_is_46_77() -> None:
    # counts with micro precision 0.5404 and micro recall 0.4123 exactly
    tp = 5404 * 4123
    fp, fn = 4123 * 10000 - tp, 5404 * 10000 - tp
    agg = aggregate_metrics([(tp, fp, fn)])
    assert agg["micro_tp"] == pytest.approx(0.5404) and agg["micro_tr"] == pytest.approx(0.4123)
    # hand-computed: 2 * 54.04 * 41.23 / (54.04 + 41.23) = 4456.1384 / 95.27 = 46.7738...
    assert round(100 * agg["micro_tf1"], 2) == 46.77
    num, den = MICRO_METRICS["tf1"]  # the report's form: 2TP / (2TP + FP + FN)
    counts = {"TP": tp, "FP": fp, "FN": fn}
    value = sum(c * counts[k] for k, c in num.items()) / sum(c * counts[k] for k, c in den.items())
    assert value == pytest.approx(agg["micro_tf1"])


def _two_samples(tmp_path: Path, average: str | None = None) -> tuple[dict[str, Any], Path]:
    cfg = copy.deepcopy(load_config(EXAMPLE_CONFIG))
    cfg["seeds"] = [0]
    if average:
        cfg["benchmarks"]["finmcp"]["aggregate"]["average"] = average
    # sample a: 1 tool called, the 1 gold tool -> P = R = F1 = 1
    # sample b: 4 tools called, 4 gold tools, 1 in common -> P = R = F1 = 1/4
    rows = [
        {"split": "all", "task_id": "a", "score": 1.0, "subscores": {"tp": 1.0, "tr": 1.0, "tf1": 1.0},
         "extra": {"TP": 1, "FP": 0, "FN": 0}},
        {"split": "all", "task_id": "b", "score": 0.25,
         "subscores": {"tp": 0.25, "tr": 0.25, "tf1": 0.25}, "extra": {"TP": 1, "FP": 3, "FN": 3}},
    ]
    _write(cfg, tmp_path, "envace_8b", "finmcp", rows)
    return cfg, tmp_path


def test_two_samples_micro_differs_from_macro(tmp_path: Path) -> None:
    # hand-computed: macro = (1 + 1/4) / 2 = 0.625 for TP, TR and TF1;
    # micro: TP = 2, FP = 3, FN = 3 -> P = R = 2/5 = 0.4, F1 = 0.4
    agg = aggregate_metrics([(1, 0, 0), (1, 3, 3)])
    assert agg["macro_tf1"] == pytest.approx(0.625) and agg["micro_tf1"] == pytest.approx(0.4)
    cfg, root = _two_samples(tmp_path)
    for metric in ("tp", "tr", "tf1"):
        micro = load_evaluation(cfg, root, "eval", "envace_8b", "finmcp", metric)  # default: micro
        assert micro.average == "micro" and isinstance(micro.matrix, RatioMatrix)
        assert micro.matrix.point() == pytest.approx(0.4)
        assert micro.group_means() == {"all": pytest.approx(0.4)}
        macro = load_evaluation(cfg, root, "eval", "envace_8b", "finmcp", metric, "macro")
        assert macro.average == "macro" and macro.matrix.point() == pytest.approx(0.625)
    switched, _ = _two_samples(tmp_path / "switched", "macro")  # the config switch
    assert load_evaluation(switched, tmp_path / "switched", "eval", "envace_8b", "finmcp").matrix.point() == (
        pytest.approx(0.625)
    )


def test_micro_counts_failed_samples_as_missed_gold_tools(tmp_path: Path) -> None:
    cfg = copy.deepcopy(load_config(EXAMPLE_CONFIG))
    cfg["seeds"] = [0]
    rows = [
        {"split": "all", "task_id": "a", "score": 1.0, "subscores": {"tp": 1.0, "tr": 1.0, "tf1": 1.0},
         "extra": {"TP": 2, "FP": 0, "FN": 0}},
        # ended by the turn limit: its 1 + 1 gold tools count as missed, its calls are not counted
        {"split": "all", "task_id": "b", "score": 0.0, "status": "failed", "reason": "max_turns",
         "extra": {"TP": 1, "FP": 5, "FN": 1}},
        {"split": "all", "task_id": "c", "score": 0.0, "status": "failed", "reason": "crash", "extra": {}},
    ]
    _write(cfg, tmp_path, "envace_8b", "finmcp", rows)
    ev = load_evaluation(cfg, tmp_path, "eval", "envace_8b", "finmcp", "tr")
    assert ev.matrix.point() == pytest.approx(2 / 4)  # TP 2 over TP + FN = 2 + 2
    assert load_evaluation(cfg, tmp_path, "eval", "envace_8b", "finmcp", "tp").matrix.point() == 1.0
    assert ev.n_failed == 2 and ev.n_failed_uncounted == 1


def test_ratio_bootstrap_recomputes_the_ratio() -> None:
    rng = np.random.default_rng(0)
    num = rng.integers(0, 4, size=(40, 3)).astype(float)
    den = num + rng.integers(0, 4, size=(40, 3))
    groups, weights = np.zeros(40, dtype=int), np.ones(1)
    ratio = RatioMatrix(TaskMatrix(num, groups, weights), TaskMatrix(den, groups, weights))
    assert ratio.point() == pytest.approx(num.sum() / den.sum())
    iv = bootstrap_mean(ratio, resamples=2000, seed=1)
    assert iv.low < ratio.point() < iv.high and 0.0 <= iv.low and iv.high <= 1.0
    assert not iv.degenerate


# --- BFCL-v4: bfcl-eval's own leaderboard aggregation ---------------------------------------------

CATEGORIES = {  # category -> (tasks, successes): accuracies that differ between categories
    "simple_python": (8, 6), "simple_java": (5, 1), "simple_javascript": (4, 3), "multiple": (6, 2),
    "parallel": (5, 4), "parallel_multiple": (4, 1), "irrelevance": (6, 5), "live_simple": (7, 3),
    "live_multiple": (9, 6), "live_parallel": (3, 1), "live_parallel_multiple": (4, 4),
    "live_irrelevance": (8, 2), "live_relevance": (3, 3), "multi_turn_base": (5, 2),
    "multi_turn_miss_func": (4, 3), "multi_turn_miss_param": (6, 1), "multi_turn_long_context": (3, 2),
}


def _bfcl_eval_leaderboard(monkeypatch: pytest.MonkeyPatch, scores: dict[str, dict[str, float]]) -> dict:
    """bfcl-eval's ``generate_leaderboard_csv`` on ``scores`` (category -> accuracy / total_count); the
    rows it would write, before its CSV writer formats them, by file name."""
    bfcl_common._ensure_project_root()
    # its model table imports every provider SDK (tree-sitter, ...); the leaderboard needs one entry
    stub = types.ModuleType("bfcl_eval.constants.model_config")
    stub.MODEL_CONFIG_MAPPING = {"envace/probe": types.SimpleNamespace(
        display_name="probe", url="-", org="-", license="-", input_price=None, output_price=None)}
    monkeypatch.setitem(sys.modules, "bfcl_eval.constants.model_config", stub)
    name = "bfcl_eval.eval_checker.eval_runner_helper"
    sys.modules.pop(name, None)
    try:
        helper = importlib.import_module(name)
        written: dict[str, dict[str, Any]] = {}

        def capture(data: list, file_path: Any, header: list, *args: Any, **kwargs: Any) -> None:
            written[Path(file_path).name] = dict(zip(header, data[0], strict=True))

        monkeypatch.setattr(helper, "write_score_csv_file", capture)
        helper.generate_leaderboard_csv({"envace_probe": copy.deepcopy(scores)}, Path("unused"))
    finally:
        sys.modules.pop(name, None)
    return written


def test_bfcl_groups_and_overall_equal_bfcl_evals_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    accuracy = {c: k / n for c, (n, k) in CATEGORIES.items()}
    counts = {c: n for c, (n, _) in CATEGORIES.items()}
    theirs = _bfcl_eval_leaderboard(
        monkeypatch, {c: {"accuracy": accuracy[c], "total_count": counts[c]} for c in CATEGORIES}
    )
    ours = bfcl.leaderboard_scores(accuracy, counts)
    assert ours["non_live"] == pytest.approx(theirs["data_non_live.csv"]["Non-Live Overall Acc"], abs=1e-12)
    assert ours["live"] == pytest.approx(theirs["data_live.csv"]["Live Overall Acc"], abs=1e-12)
    assert ours["irrelevance"] == pytest.approx(
        theirs["data_overall.csv"]["Irrelevance Detection"], abs=1e-12
    )
    assert ours["multi_turn"] == pytest.approx(
        theirs["data_multi_turn.csv"]["Multi Turn Overall Acc"], abs=1e-12
    )
    # agentic did not run: bfcl-eval counts it 0 with weight 40 ("N/A" shown, 0 in Overall)
    assert theirs["data_agentic.csv"]["Agentic Overall Acc"] == 0
    overall = theirs["data_overall.csv"]["Overall Acc"]
    assert ours["overall_leaderboard"] == pytest.approx(overall, abs=1e-12)
    assert ours["overall"] == pytest.approx(overall * 100 / 60, abs=1e-12)  # ours: re-normalised 10/10/10/30
    assert "agentic" not in ours

    # the same scores through the report: per-task result files -> load_evaluation (method bfcl_eval)
    cfg = copy.deepcopy(load_config(EXAMPLE_CONFIG))
    cfg["seeds"] = [0, 1]
    agg = cfg["benchmarks"]["bfcl_v4"]["aggregate"]
    agg["method"] = "bfcl_eval"
    cfg["benchmarks"]["bfcl_v4"]["splits"] = list(CATEGORIES)
    rows = [{"split": c, "task_id": f"{c}_{i}", "score": float(i < k)}
            for c, (n, k) in CATEGORIES.items() for i in range(n)]
    root = tmp_path
    _write(cfg, root, "envace_8b", "bfcl_v4", rows)
    ev = load_evaluation(cfg, root, "eval", "envace_8b", "bfcl_v4")
    assert ev.method == "bfcl_eval"
    assert ev.group_names == ("non_live", "live", "irrelevance", "multi_turn")
    assert ev.dropped_groups == ("agentic",)
    for group, value in ev.group_means().items():
        assert value == pytest.approx(ours[group], abs=1e-12)
    assert ev.matrix.point() == pytest.approx(ours["overall"], abs=1e-12)
    assert ev.group_weights() == pytest.approx({"non_live": 1 / 6, "live": 1 / 6, "irrelevance": 1 / 6,
                                                "multi_turn": 1 / 2})
    assert ev.unscored == {"live_relevance": pytest.approx(1.0)}  # reported, weighted into nothing
    assert ev.stratum_means()["simple_java"] == pytest.approx(1 / 5)  # strata: categories
    iv = bootstrap_mean(ev.matrix, resamples=500, seed=3)
    assert iv.low <= ev.matrix.point() <= iv.high
    summary = summarize(ReportContext(cfg, root, resamples=200), "eval", "envace_8b", "bfcl_v4")
    assert summary["method"] == "bfcl_eval" and summary["value"] == pytest.approx(100 * ours["overall"])
    assert summary["leaderboard_overall"] == pytest.approx(100 * overall)
    assert summary["group_means"]["live"] == pytest.approx(100 * ours["live"])
    assert summary["unscored"] == {"live_relevance": pytest.approx(100.0)}
    assert ev.overall_label == summary["overall_label"] == "re-weighted, without agentic"

    # the switch: pooled groups (live_relevance inside Live) give other values on the same results
    agg["method"] = "pooled"
    agg["groups"] = {
        "non_live": {"weight": 10, "splits": ["simple_python", "simple_java", "simple_javascript", "multiple",
                                              "parallel", "parallel_multiple"]},
        "live": {"weight": 10, "splits": ["live_simple", "live_multiple", "live_parallel",
                                          "live_parallel_multiple", "live_relevance"]},
        "irrelevance": {"weight": 10, "splits": ["irrelevance", "live_irrelevance"]},
        "multi_turn": {"weight": 30, "splits": list(bfcl_common.MULTI_TURN_SPLITS)},
    }
    pooled_root = root / "pooled"
    _write(cfg, pooled_root, "envace_8b", "bfcl_v4", rows)
    pooled = load_evaluation(cfg, pooled_root, "eval", "envace_8b", "bfcl_v4").group_means()
    assert pooled["non_live"] == pytest.approx(17 / 32)  # pooled: successes / tasks
    assert pooled["non_live"] != pytest.approx(ours["non_live"])


AGENTIC = {"web_search_base": (5, 2), "web_search_no_snippet": (4, 3), "memory_kv": (6, 5),
           "memory_vector": (3, 1), "memory_rec_sum": (4, 2)}


def _bfcl_config(categories: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """The example config with bfcl_v4 running ``categories`` under ``method: bfcl_eval``."""
    cfg = copy.deepcopy(load_config(EXAMPLE_CONFIG))
    cfg["seeds"] = [0, 1]
    cfg["benchmarks"]["bfcl_v4"]["aggregate"]["method"] = "bfcl_eval"
    cfg["benchmarks"]["bfcl_v4"]["splits"] = list(categories)
    return cfg


def test_bfcl_overall_with_agentic_equals_bfcl_evals_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    every = {**CATEGORIES, **AGENTIC}
    accuracy = {c: k / n for c, (n, k) in every.items()}
    counts = {c: n for c, (n, _) in every.items()}
    theirs = _bfcl_eval_leaderboard(
        monkeypatch, {c: {"accuracy": accuracy[c], "total_count": counts[c]} for c in every}
    )
    overall = theirs["data_overall.csv"]["Overall Acc"]
    agentic = theirs["data_agentic.csv"]["Agentic Overall Acc"]
    # by hand: mean(mean(2/5, 3/4), mean(5/6, 1/3, 2/4))
    assert agentic == pytest.approx(((2 / 5 + 3 / 4) / 2 + (5 / 6 + 1 / 3 + 2 / 4) / 3) / 2, abs=1e-12)
    ours = bfcl.leaderboard_scores(accuracy, counts)
    assert ours["agentic"] == pytest.approx(agentic, abs=1e-12)
    assert ours["overall"] == pytest.approx(overall, abs=1e-12)
    assert ours["overall_leaderboard"] == pytest.approx(overall, abs=1e-12)

    # through the report: leaderboard (the default) weighs all five groups
    cfg = _bfcl_config(every)
    rows = [{"split": c, "task_id": f"{c}_{i}", "score": float(i < k)}
            for c, (n, k) in every.items() for i in range(n)]
    _write(cfg, tmp_path, "envace_8b", "bfcl_v4", rows)
    ev = load_evaluation(cfg, tmp_path, "eval", "envace_8b", "bfcl_v4")
    assert ev.group_names == ("non_live", "live", "irrelevance", "multi_turn", "agentic")
    assert ev.dropped_groups == () and ev.dropped_categories == () and ev.excluded_groups == {}
    assert ev.group_means()["agentic"] == pytest.approx(agentic, abs=1e-12)
    assert ev.matrix.point() == pytest.approx(overall, abs=1e-12)
    assert ev.unscored == {"live_relevance": pytest.approx(1.0)}
    assert ev.overall_label == "leaderboard Overall"
    assert describe_overall(ev, cfg["benchmarks"]["bfcl_v4"]["package"]) == (
        "leaderboard Overall (bfcl-eval 2026.3.23: non-live/live/irrelevance/multi-turn/agentic = "
        "10/10/10/30/40)"
    )
    summary = summarize(ReportContext(cfg, tmp_path, resamples=200), "eval", "envace_8b", "bfcl_v4")
    assert summary["overall_label"] == "leaderboard Overall"
    assert summary["value"] == pytest.approx(100 * overall)
    assert summary["leaderboard_overall"] == pytest.approx(100 * overall)

    # without_agentic on the same files (report-only: same hash): agentic reported, weighted into nothing
    cfg["benchmarks"]["bfcl_v4"]["aggregate"]["overall"] = "without_agentic"
    ev = load_evaluation(cfg, tmp_path, "eval", "envace_8b", "bfcl_v4")
    four = (overall - 0.4 * agentic) / 0.6  # bfcl-eval's four groups, 10/10/10/30 re-normalised
    assert ev.group_names == ("non_live", "live", "irrelevance", "multi_turn")
    assert ev.matrix.point() == pytest.approx(four, abs=1e-12)
    assert ev.dropped_groups == () and ev.dropped_categories == ()
    assert ev.unscored == pytest.approx({"live_relevance": 1.0, **{c: accuracy[c] for c in AGENTIC}})
    assert ev.excluded_groups == {"agentic": pytest.approx(agentic, abs=1e-12)}
    assert ev.overall_label == "re-weighted, without agentic"
    assert describe_overall(ev, cfg["benchmarks"]["bfcl_v4"]["package"]) == (
        "re-weighted, without agentic (bfcl-eval 2026.3.23: non-live/live/irrelevance/multi-turn = "
        "10/10/10/30, re-normalised)"
    )
    summary = summarize(ReportContext(cfg, tmp_path, resamples=200), "eval", "envace_8b", "bfcl_v4")
    assert summary["overall_label"] == "re-weighted, without agentic"
    assert summary["value"] == pytest.approx(100 * four)
    assert summary["excluded_groups"] == {"agentic": pytest.approx(100 * agentic)}
    assert summary["leaderboard_overall"] == pytest.approx(100 * overall)  # bfcl-eval's, agentic weighted in


def test_bfcl_overall_label_names_what_did_not_run(tmp_path: Path) -> None:
    ran = {c: CATEGORIES[c] for c in ("simple_python", "irrelevance", "multi_turn_base")}
    cfg = _bfcl_config(ran)
    rows = [{"split": c, "task_id": f"{c}_{i}", "score": float(i < k)} for c, (n, k) in ran.items()
            for i in range(n)]
    _write(cfg, tmp_path, "envace_8b", "bfcl_v4", rows)
    ev = load_evaluation(cfg, tmp_path, "eval", "envace_8b", "bfcl_v4")
    assert ev.overall_label == (
        "re-weighted, without live, agentic; missing categories in non_live, irrelevance, multi_turn"
    )
    cfg["benchmarks"]["bfcl_v4"]["aggregate"]["overall"] = "without_agentic"
    ev = load_evaluation(cfg, tmp_path, "eval", "envace_8b", "bfcl_v4")
    assert ev.dropped_groups == ("live", "agentic") and ev.excluded_groups == {}
    assert ev.overall_label.startswith("re-weighted, without live, agentic; ")


def test_bfcl_overall_switch_needs_method_bfcl_eval(tmp_path: Path) -> None:
    cfg = _bfcl_config(CATEGORIES)
    agg = cfg["benchmarks"]["bfcl_v4"]["aggregate"]
    agg["overall"] = "sometimes"
    with pytest.raises(ValueError, match=r"benchmarks\.bfcl_v4\.aggregate\.overall must be one of"):
        load_evaluation(cfg, tmp_path, "eval", "envace_8b", "bfcl_v4")
    agg["method"], agg["overall"] = "pooled", "without_agentic"
    with pytest.raises(ValueError, match=r"bfcl_v4\.aggregate\.overall: without_agentic is only "):
        load_evaluation(cfg, tmp_path, "eval", "envace_8b", "bfcl_v4")
    # Snakemake's schema validation fills the default (leaderboard) in for every benchmark of the config
    # the DAG's summary jobs read: harmless with pooled (tau2; CI failed on this once)
    resolved = load_config(ROOT / "config" / "smoke.yaml")
    resolved["benchmarks"]["tau2"]["aggregate"]["overall"] = "leaderboard"
    with pytest.raises(IncompleteResultsError):  # no result files here: past the config checks
        load_evaluation(resolved, tmp_path, "eval", "qwen3_8b", "tau2")


def test_bfcl_weights_renormalise_over_what_ran() -> None:
    lw = bfcl.leaderboard_weights({"simple_python": 3, "irrelevance": 2, "multi_turn_base": 2,
                                   "multi_turn_miss_func": 2})
    assert lw.within == {"non_live": {"simple_python": 1.0}, "irrelevance": {"irrelevance": 1.0},
                         "multi_turn": {"multi_turn_base": 0.5, "multi_turn_miss_func": 0.5}}
    assert lw.group_weights == {"non_live": 10.0, "irrelevance": 10.0, "multi_turn": 30.0}
    assert lw.dropped_groups == ("live", "agentic") and "simple_java" in lw.dropped_categories
    assert sum(lw.category_weights().values()) == pytest.approx(1.0)
    # a live category's weight in Live is its share of the live AST tasks that ran
    live = bfcl.leaderboard_weights({"live_simple": 1, "live_multiple": 3}).within["live"]
    assert live == pytest.approx({"live_simple": 0.25, "live_multiple": 0.75})
