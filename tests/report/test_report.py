"""Tables, aggregate, figures and diff on the example results (and on broken copies of them)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from envace.common.config import eval_hash
from envace.common.results import eval_path, manifest_path, read_results, write_results
from envace.common.stats import Interval
from envace.report.context import Cell, ReportContext
from envace.report.diff import cell_status, verdict
from envace.report.tables import build_table1, to_latex, to_markdown

from .conftest import EXAMPLE_CONFIG, EXAMPLE_RESULTS, example_lines, run_cli

BASE = ["--config", str(EXAMPLE_CONFIG), "--resamples", "300"]


def hand_mean(kind: str, name: str, bench: str, seeds: list[int], metric: str = "score") -> dict[str, float]:
    """Per-split mean over tasks of the mean over seeds of the mean over samples (failed = 0)."""
    per_task: dict[tuple[str, str], list[float]] = {}
    for seed in seeds:
        samples: dict[tuple[str, str], list[float]] = {}
        for line in example_lines(kind, name, bench, seed):
            value = (
                0.0
                if line["status"] == "failed"
                else (line["score"] if metric == "score" else line["subscores"][metric])
            )
            samples.setdefault((line["split"], line["task_id"]), []).append(value)
        for key, values in samples.items():
            per_task.setdefault(key, []).append(sum(values) / len(values))
    splits: dict[str, list[float]] = {}
    for (split, _), runs in per_task.items():
        splits.setdefault(split, []).append(sum(runs) / len(runs))
    return {split: 100 * sum(v) / len(v) for split, v in splits.items()}


def hand_micro(name: str, bench: str, seeds: list[int]) -> dict[str, float]:
    """FinMCP micro TP / TR / TF1 (percent): counts summed over every sample of every seed."""
    tp = fp = fn = 0
    for seed in seeds:
        for line in example_lines("eval", name, bench, seed):
            tp, fp, fn = tp + line["extra"]["TP"], fp + line["extra"]["FP"], fn + line["extra"]["FN"]
    p, r = tp / (tp + fp), tp / (tp + fn)
    return {"tp": 100 * p, "tr": 100 * r, "tf1": 100 * 2 * p * r / (p + r)}


def read_csv(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, comment="#").set_index("label")


@pytest.fixture(scope="module")
def table_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tables")
    for name in ("table1", "table2", "table3"):
        assert run_cli(["tables", name, *BASE, "--out-dir", str(out)]) == 0
    return out


def test_table1_cells_equal_hand_computed_means(table_dir: Path) -> None:
    t1 = read_csv(table_dir / "table1.csv")
    tau2 = hand_mean("eval", "envace_1p7b", "tau2", [0, 1])  # includes the one failed sample
    assert t1.loc["EnvACE-1.7B", "tau2"] == pytest.approx((tau2["airline"] + tau2["retail"]) / 2)
    bfcl = hand_mean("eval", "envace_8b", "bfcl_v4", [0, 1])  # agentic group dropped: weights 10/30
    assert t1.loc["EnvACE-8B", "bfcl_v4"] == pytest.approx(
        (10 * bfcl["simple_python"] + 30 * bfcl["multi_turn_base"]) / 40
    )
    row = t1.loc["EnvACE-8B"]
    assert row["overall"] == pytest.approx((row["bfcl_v4"] + row["tau2"] + row["vitabench"]) / 3)
    assert row["tau2_ci_low"] <= row["tau2"] <= row["tau2_ci_high"]
    assert row["bfcl_v4_paper"] == 46.04


def test_table1_missing_cells_are_marked(table_dir: Path) -> None:
    t1 = read_csv(table_dir / "table1.csv")
    assert np.isnan(t1.loc["ScaleEnv-8B", "bfcl_v4"]) and np.isnan(t1.loc["ScaleEnv-8B", "overall"])
    assert "does not exist" in t1.loc["ScaleEnv-8B", "overall_missing"]
    assert "no model with this label" in t1.loc["AWM-14B", "tau2_missing"]  # paper row, not configured
    md = (table_dir / "table1.md").read_text()
    assert "| ScaleEnv-8B | MISSING |" in md and "MISSING cells:" in md
    assert "SMOKE scale" in md and "300 resamples, seed 12345" in md and "seeds [0, 1]" in md
    tex = (table_dir / "table1.tex").read_text()
    assert r"\toprule" in tex and r"\textsc{missing}" in tex and "% SMOKE scale" in tex


def test_table2_and_table3_values(table_dir: Path) -> None:
    t2 = read_csv(table_dir / "table2.csv")
    micro = hand_micro("envace_8b", "finmcp", [0, 1])  # the paper's definition, the table's columns
    for metric in ("tp", "tr", "tf1"):
        assert t2.loc["EnvACE-8B", metric] == pytest.approx(micro[metric])
        assert t2.loc["EnvACE-8B", f"{metric}_macro"] == pytest.approx(
            hand_mean("eval", "envace_8b", "finmcp", [0, 1], metric)["all"]
        )
        row = t2.loc["EnvACE-8B"]
        assert row[f"{metric}_ci_low"] <= micro[metric] <= row[f"{metric}_ci_high"]
    assert micro["tf1"] != pytest.approx(t2.loc["EnvACE-8B", "tf1_macro"])
    md = (table_dir / "table2.md").read_text()
    assert "micro averages" in md and "tf1_macro" in md
    t3 = read_csv(table_dir / "table3.csv").set_index("row")
    tau2 = hand_mean("tts", "parallel_n2_envace", "tau2", [0])
    assert t3.loc["parallel_envace", "tau2"] == pytest.approx((tau2["airline"] + tau2["retail"]) / 2)
    for row in ("parallel_envace", "sequential_base"):
        assert t3.loc[row, "overall"] == pytest.approx(
            (t3.loc[row, "tau2"] + t3.loc[row, "bfcl_multi_turn"]) / 2
        )
        assert t3.loc[row, "delta"] == pytest.approx(t3.loc[row, "overall"] - t3.loc["no_tts", "overall"])
    assert np.isnan(t3.loc["no_tts", "delta"])


def test_aggregate_summary(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    assert (
        run_cli(["aggregate", *BASE, "--model", "envace_1p7b", "--benchmark", "tau2", "--out", str(out)]) == 0
    )
    s = json.loads(out.read_text())
    assert s["n_failed"] == 1 and s["n_exceptions"] == 0
    assert s["n_tasks"] == 6 and s["n_samples"] == 24 and s["avg_at_k"] == 2
    assert s["group_means"] == pytest.approx(hand_mean("eval", "envace_1p7b", "tau2", [0, 1]))
    assert s["provenance"]["manifests"][0]["git_commit"].endswith("example")
    fin = tmp_path / "fin.json"
    assert run_cli(["aggregate", *BASE, "--model", "awm_8b", "--benchmark", "finmcp", "--out", str(fin)]) == 0
    fs = json.loads(fin.read_text())
    assert set(fs["metrics"]) == {"tp", "tr", "tf1"}
    assert fs["value"] == pytest.approx(hand_micro("awm_8b", "finmcp", [0, 1])["tf1"])
    tf1 = fs["metrics"]["tf1"]
    assert tf1["average"] == "micro" and tf1["macro"]["point"] == pytest.approx(
        hand_mean("eval", "awm_8b", "finmcp", [0, 1], "tf1")["all"]
    )
    assert tf1["ci_low"] <= tf1["point"] <= tf1["ci_high"]
    assert (
        run_cli(["aggregate", *BASE, "--model", "scaleenv_8b", "--benchmark", "bfcl_v4", "--out", str(fin)])
        == 1
    )


def test_table1_notes_say_which_bfcl_overall(results_copy: Path, cfg: dict) -> None:
    cfg = copy.deepcopy(cfg)
    agg = cfg["benchmarks"]["bfcl_v4"]["aggregate"]
    agg["method"] = "bfcl_eval"  # the examples hold simple_python and multi_turn_base lines
    for seed in cfg["seeds"]:  # EnvACE-1.7B with web_search_base lines too: another re-weighting
        path = eval_path(results_copy, "envace_1p7b", "bfcl_v4", seed)
        lines = read_results(path).lines
        web = [{**line, "split": "web_search_base", "task_id": f"web_{line['task_id']}"}
               for line in lines if line["split"] == "simple_python"]
        write_results(path, lines + web, model="envace_1p7b", benchmark="bfcl_v4", seed=seed,
                      scale=cfg["scale"], config_hash=eval_hash(cfg, "envace_1p7b", "bfcl_v4"),
                      git_commit="test", package_versions={})
    with_agentic = (
        "BFCL-v4: re-weighted, without live, irrelevance; missing categories in non_live, multi_turn, "
        "agentic (bfcl-eval 2026.3.23: non-live/multi-turn/agentic = 10/30/40, re-normalised)"
    )
    without_agentic = (
        "BFCL-v4: re-weighted, without live, irrelevance, agentic; missing categories in non_live, "
        "multi_turn (bfcl-eval 2026.3.23: non-live/multi-turn = 10/30, re-normalised)"
    )
    table = build_table1(ReportContext(cfg, results_copy, resamples=50))
    ran = [r.label for r in table.rows if r.cells["bfcl_v4"] is not None and r.cells["bfcl_v4"].ok]
    assert "ScaleEnv-8B" not in ran and "EnvACE-1.7B" in ran  # MISSING cells carry no label
    others = ", ".join(label for label in ran if label != "EnvACE-1.7B")
    assert table.notes == [f"{without_agentic} — rows: {others}", f"{with_agentic} — rows: EnvACE-1.7B"]
    assert f"Note: {table.notes[0]}" in to_markdown(table, "header")
    assert f"% note: {table.notes[1]}" in to_latex(table, "header")

    agg["overall"] = "without_agentic"  # now every row is the same re-weighting: one note, no rows named
    table = build_table1(ReportContext(cfg, results_copy, resamples=50))
    assert table.notes == [without_agentic]


@pytest.mark.parametrize("figure", ["fig3", "fig4", "fig5", "fig6"])
def test_figures_written(tmp_path: Path, figure: str) -> None:
    out = tmp_path / f"{figure}.pdf"
    assert run_cli(["figures", figure, *BASE, "--out", str(out)]) == 0
    assert out.stat().st_size > 1000 and out.with_suffix(".png").stat().st_size > 1000


def test_figure5_follows_rehearse_per_step(tmp_path: Path, cfg: dict, results_copy: Path) -> None:
    """Figure 5's REHEARSE panel: each ``report.fig5_rehearse_runs`` run's per-step exact match from its
    done-file, in percent and step order; a run without a done-file or the metric is left out."""
    from envace.report.points import figure5_rehearse

    done = results_copy / "train" / "envace_8b" / "done.json"
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps({"rehearse_per_step": {"reference_exact": {"10": 0.5, "2": 0.25}}}))
    other = results_copy / "train" / "grpo_8b" / "done.json"
    other.parent.mkdir(parents=True)
    other.write_text(json.dumps({"judge_failures_per_step": {}}))
    runs = {**cfg, "report": {**cfg["report"], "fig5_rehearse_runs": ["envace_8b", "grpo_8b", "per_role_8b"]}}
    assert figure5_rehearse(ReportContext(runs, results_copy)) == {"envace_8b": {2: 25.0, 10: 50.0}}
    assert figure5_rehearse(ReportContext(cfg, results_copy)) == {"envace_8b": {2: 25.0, 10: 50.0}}  # default
    out = tmp_path / "fig5.pdf"
    assert run_cli(["figures", "fig5", "--config", str(EXAMPLE_CONFIG), "--results-dir", str(results_copy),
                    "--out", str(out)]) == 0
    assert out.with_suffix(".png").stat().st_size > 1000


def corrupt_truncate(results: Path) -> None:
    path = eval_path(results, "envace_8b", "tau2", 1)
    path.write_text(path.read_text()[:-15] + "\n")


def corrupt_nan(results: Path) -> None:
    path = eval_path(results, "awm_8b", "vitabench", 0)
    lines = path.read_text().splitlines()
    record = json.loads(lines[0])
    lines[0] = json.dumps(record).replace(f'"score": {record["score"]}', '"score": NaN')
    path.write_text("\n".join(lines) + "\n")


def corrupt_hash(results: Path) -> None:
    m = manifest_path(eval_path(results, "qwen3_8b", "bfcl_v4", 0))
    m.write_text(json.dumps({**json.loads(m.read_text()), "config_hash": "ffffffffffffffff"}))


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (corrupt_truncate, "seed1.jsonl: line 12: invalid or truncated JSON"),
        (corrupt_nan, "seed0.jsonl: line 1: non-finite number NaN"),
        (corrupt_hash, "config hash mismatch: manifest has ffffffffffffffff, the current config expects"),
    ],
)
def test_bad_input_is_a_clear_error(
    results_copy: Path, tmp_path: Path, capsys, corrupt, message: str
) -> None:
    corrupt(results_copy)
    rc = run_cli(
        ["tables", "table1", *BASE, "--results-dir", str(results_copy), "--out-dir", str(tmp_path / "t")]
    )
    assert rc == 4 and message in capsys.readouterr().err
    assert not (tmp_path / "t" / "table1.csv").exists()


def test_missing_evaluation_gives_missing_cell(results_copy: Path, tmp_path: Path) -> None:
    manifest_path(eval_path(results_copy, "envace_8b", "vitabench", 1)).unlink()
    out = tmp_path / "t"
    assert (
        run_cli(["tables", "table1", *BASE, "--results-dir", str(results_copy), "--out-dir", str(out)]) == 0
    )
    t1 = read_csv(out / "table1.csv")
    assert np.isnan(t1.loc["EnvACE-8B", "vitabench"]) and np.isnan(t1.loc["EnvACE-8B", "overall"])
    assert "no manifest" in t1.loc["EnvACE-8B", "vitabench_missing"]
    assert not np.isnan(t1.loc["EnvACE-8B", "tau2"])


def iv(point: float, low: float, high: float) -> Cell:
    return Cell(Interval(point, low, high, 0.95, 1000, 1))


def test_cell_statuses() -> None:
    assert cell_status(36.7, iv(36.74, 30.0, 40.0), 1) == "EXACT"
    assert cell_status(36.7, iv(36.76, 30.0, 40.0), 1) == "WITHIN_CI"
    assert cell_status(46.04, iv(46.045, 46.0, 46.1), 2) == "EXACT"
    assert cell_status(36.7, iv(20.0, 15.0, 25.0), 1) == "OUTSIDE_CI"
    assert cell_status(36.7, Cell(None, ("absent",)), 1) == "MISSING"
    assert cell_status(None, iv(20.0, 15.0, 25.0), 1) == "NO_PAPER_VALUE"


def test_claim_verdicts() -> None:
    pos, zero, neg = iv(5, 1, 9), iv(0, -3, 3), iv(-5, -9, -1)
    assert verdict([pos, pos]) == "SUPPORTED"
    assert verdict([pos, zero]) == "INCONCLUSIVE"
    assert verdict([pos, neg]) == "REFUTED"
    assert verdict([pos], [zero]) == "SUPPORTED"
    assert verdict([pos], [pos]) == "REFUTED"
    assert verdict([pos, Cell(None, ("absent",))]) == "MISSING"


def run_diff(results: Path, out: Path, *extra: str) -> tuple[int, dict]:
    rc = run_cli(
        [
            "diff",
            *BASE,
            "--results-dir",
            str(results),
            "--out-md",
            str(out / "d.md"),
            "--out-json",
            str(out / "d.json"),
            *extra,
        ]
    )
    return rc, json.loads((out / "d.json").read_text())


def test_diff_without_results_lists_every_cell_missing(tmp_path: Path) -> None:
    (tmp_path / "none").mkdir()  # an empty results directory (one that does not exist is an error)
    rc, d = run_diff(tmp_path / "none", tmp_path, "--strict")
    assert rc == 0
    paper_cells = 11 * 4 + 3 * 3 + 5 * 3 + 3 + 2 * 2 * 2 + 2
    assert len(d["entries"]) == paper_cells
    assert {e["status"] for e in d["entries"]} == {"MISSING"}
    assert {c["status"] for c in d["claims"]} == {"MISSING"} and len(d["claims"]) == 6
    assert "SMOKE scale" in (tmp_path / "d.md").read_text()


def test_diff_on_examples_and_strict(tmp_path: Path) -> None:
    rc, d = run_diff(EXAMPLE_RESULTS, tmp_path)
    assert rc == 0
    entry = {(e["table"], e["row"], e["column"]): e for e in d["entries"]}
    e = entry[("table1", "EnvACE-8B", "tau2")]
    assert e["delta"] == pytest.approx(e["ours"] - 36.7)
    assert entry[("table1", "ScaleEnv-8B", "bfcl_v4")]["status"] == "MISSING"
    assert entry[("figure5", "step 50", "tau2")]["status"] == "MISSING"  # smoke steps are 2 and 4
    assert d["header"]["bootstrap"] == {
        "resamples": 300,
        "seed": 12345,
        "confidence": 0.95,
        "method": "two-level percentile bootstrap (envace.common.stats)",
    }
    assert d["counts"].get("OUTSIDE_CI", 0) > 0
    assert run_diff(EXAMPLE_RESULTS, tmp_path, "--strict")[0] == 1


def test_claims_on_crafted_results(results_copy: Path, tmp_path: Path, rewrite) -> None:
    rewrite(results_copy, "eval", "envace_8b", "tau2", 1.0)
    rewrite(results_copy, "eval", "grpo_8b", "tau2", 0.0)
    rewrite(results_copy, "eval", "per_role_8b", "tau2", 1.0)
    for bench in ("tau2", "bfcl_multi_turn"):
        rewrite(results_copy, "tts", "no_tts", bench, 0.0)
        rewrite(results_copy, "tts", "parallel_n2_base", bench, 1.0)
        rewrite(results_copy, "tts", "parallel_n2_envace", bench, 1.0)
    rc, d = run_diff(results_copy, tmp_path, "--strict")
    claims = {c["id"]: c for c in d["claims"]}
    assert claims["rehearsal_beats_grpo"]["status"] == "SUPPORTED"
    assert claims["rehearsal_beats_grpo"]["comparisons"][0]["point"] == pytest.approx(100.0)
    assert claims["shared_beats_per_role"]["status"] == "INCONCLUSIVE"  # identical: degenerate 0
    assert claims["parallel_tts_helps"]["status"] == "REFUTED"  # base rehearsal helps too
    assert rc == 1


def test_fig3_shows_our_zero_points_above_the_axis(results_copy: Path, cfg: dict, rewrite) -> None:
    """A model scoring 0 gets a bar of height 0: its marker and value must still show, above the axis."""
    from matplotlib.figure import Figure

    from envace.report import points
    from envace.report.figures import fig3

    rewrite(results_copy, "eval", cfg["report"]["fig3"]["grpo"], points.FIG3_BENCHMARK, 0.0)
    fig = Figure()
    fig3(ReportContext(cfg, results_copy, resamples=50), fig)
    ax = fig.axes[0]
    assert ax.get_ylim()[0] < 0  # room below 0
    markers = [(x, y) for line in ax.get_lines() for x, y in line.get_xydata() if line.get_marker() == "o"]
    assert (0.0, 0.0) in markers, markers  # grpo is Figure 3's first point
    assert "0.0" in [t.get_text() for t in ax.texts]
