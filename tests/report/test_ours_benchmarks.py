"""``evaluation.ours_benchmarks``: a benchmark of ours (the ledger at smoke scale) beside the paper's.

On the example results with VitaBench moved out of Table 1's benchmarks into ``ours_benchmarks``: it is
still evaluated for every Table 1 model, is one more Table 1 column that stays out of Overall, one more
panel of Figures 3-4 and line of Figure 5, and the evaluation claims are checked on it alone.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from envace.common.config import ConfigError, evaluation_pairs, figure5_models, load_config
from envace.report import points
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

    assert points.ours(ctx) == ["vitabench"]
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
