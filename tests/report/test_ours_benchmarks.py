"""``evaluation.ours_benchmarks``: a benchmark of ours (the ledger at smoke scale) beside the paper's.

On the example results with VitaBench moved out of Table 1's benchmarks into ``ours_benchmarks``: it is
still evaluated for every Table 1 model, is one more Table 1 column that stays out of Overall, one more
panel of Figures 3-4 and line of Figure 5, and the evaluation claims are checked on it alone.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml

from envace.common.config import ConfigError, evaluation_pairs, figure5_models, load_config, ours_benchmarks
from envace.common.results import eval_path
from envace.report.context import ReportContext
from envace.report.diff import ON_OURS, claim_results
from envace.report.figures import FIGURES
from envace.report.tables import build_table1, to_markdown

from .conftest import EXAMPLE_CONFIG, EXAMPLE_RESULTS


@pytest.fixture(scope="module")
def ours_cfg() -> dict:
    cfg = copy.deepcopy(load_config(EXAMPLE_CONFIG))
    cfg["evaluation"]["table1"]["benchmarks"].remove("vitabench")
    cfg["evaluation"]["ours_benchmarks"] = ["vitabench"]
    return cfg


@pytest.fixture(scope="module")
def ctx(ours_cfg: dict) -> ReportContext:
    return ReportContext(ours_cfg, EXAMPLE_RESULTS, resamples=200)


def test_every_table1_model_and_checkpoint_is_evaluated_on_ours(ours_cfg: dict) -> None:
    pairs = set(evaluation_pairs(ours_cfg))
    for model in [*ours_cfg["evaluation"]["table1"]["models"], *figure5_models(ours_cfg).values()]:
        assert (model, "vitabench") in pairs
    # the example config has VitaBench as a Table 1 benchmark: the same pairs, plus the checkpoints'
    fig5 = {(m, "vitabench") for m in figure5_models(ours_cfg).values()}
    assert pairs == set(evaluation_pairs(load_config(EXAMPLE_CONFIG))) | fig5


def test_table1_shows_ours_beside_and_keeps_it_out_of_overall(ctx: ReportContext) -> None:
    table = build_table1(ctx)
    assert table.columns == ["bfcl_v4", "tau2", "overall", "vitabench"]
    row = next(r for r in table.rows if r.key == "envace_8b")
    paper_benches = [ctx.mean("eval", "envace_8b", [b]).interval.point for b in ("bfcl_v4", "tau2")]
    assert row.cells["overall"].interval.point == pytest.approx(sum(paper_benches) / 2)
    ours = ctx.mean("eval", "envace_8b", ["vitabench"]).interval.point
    assert row.cells["vitabench"].interval.point == ours
    text = to_markdown(table, "header")
    assert "not a paper benchmark" in text and "| VitaBench (ours) | VitaBench (paper) |" in text


def test_figures_get_a_panel_per_ours_benchmark(ctx: ReportContext) -> None:
    import matplotlib.pyplot as plt

    assert ours_benchmarks(ctx.cfg) == ["vitabench"]
    for name, panels in (("fig3", 2), ("fig4", 3)):
        fig = plt.figure()
        FIGURES[name](ctx, fig)
        assert len(fig.axes) == panels, name
        assert "(ours)" in fig.axes[-1].get_title() + fig.axes[-1].get_ylabel()
        plt.close(fig)
    fig = plt.figure()
    FIGURES["fig5"](ctx, fig)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert any("vitabench (ours" in label for label in labels)
    plt.close(fig)


def test_evaluation_claims_are_checked_on_ours_alone(ctx: ReportContext) -> None:
    results = {c["id"]: c for c in claim_results(ctx)}
    assert {f"{c}@vitabench" for c in ON_OURS} <= set(results)
    assert not any(k.startswith(("parallel_tts_helps@", "tts_n3_worse@")) for k in results)
    ours = results["rehearsal_beats_grpo@vitabench"]
    assert ours["comparisons"][0]["comparison"] == "envace_8b - grpo_8b on vitabench"
    assert "ours" in ours["text"]
    paper = results["rehearsal_beats_grpo"]
    assert paper["comparisons"][0]["comparison"] == "envace_8b - grpo_8b on tau2"


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    raw = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    for ours, message in ((["no_such_bench"], "evaluation.ours_benchmarks' names unknown benchmark"),
                          (["tau2"], "in both evaluation.ours_benchmarks and evaluation.table1.benchmarks")):
        bad = copy.deepcopy(raw)
        bad["evaluation"]["ours_benchmarks"] = ours
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(bad))
        with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
            load_config(path)


def test_learning_section_pairs_each_trained_model_with_the_base(ours_cfg: dict, results_copy: Path,
                                                                 rewrite) -> None:
    """report.learning: trained - base on each ours benchmark, paired over tasks; RISES only when the
    interval is above 0; MISSING names the absent evaluation."""
    from envace.report.diff import build_diff, learning_results, to_markdown

    cfg = copy.deepcopy(ours_cfg)
    cfg["report"]["learning"] = {"base": "qwen3_8b", "models": ["envace_8b", "grpo_8b", "per_role_8b"]}
    rewrite(results_copy, "eval", "qwen3_8b", "vitabench", 0.0)
    rewrite(results_copy, "eval", "envace_8b", "vitabench", 1.0)
    rewrite(results_copy, "eval", "grpo_8b", "vitabench", 0.0)
    shutil.rmtree(eval_path(results_copy, "per_role_8b", "vitabench", 0).parent)
    ctx = ReportContext(cfg, results_copy, resamples=200)
    got = {e["model"]: e for e in learning_results(ctx)}
    assert got["envace_8b"]["status"] == "RISES" and got["envace_8b"]["point"] == pytest.approx(100.0)
    envace = got["envace_8b"]
    assert (envace["base"], envace["trained"], envace["training_seed"]) == (0, 100, None)  # no seed: verl's
    assert got["grpo_8b"]["status"] == "NO_RISE" and got["grpo_8b"]["training_seed"] is None
    assert got["per_role_8b"]["status"] == "MISSING" and got["per_role_8b"]["missing"]
    text = to_markdown(build_diff(ctx))
    assert "## Learning on our benchmarks" in text
    assert "| vitabench | envace_8b | verl default | 0.00 | 100.00 | +100.00" in text


def test_learning_names_an_unknown_model(tmp_path: Path) -> None:
    raw = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    raw["report"]["learning"] = {"base": "qwen3_8b", "models": ["envace_99b"]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"report\.learning' names unknown Table 1 model 'envace_99b'"):
        load_config(path)
