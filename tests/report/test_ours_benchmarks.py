"""``evaluation.ours_benchmarks``: a benchmark of ours (the ledger at smoke scale) beside the paper's.

On the example results with VitaBench moved out of Table 1's benchmarks into ``ours_benchmarks``: it is
still evaluated for every Table 1 model, is one more Table 1 column that stays out of Overall, one more
panel of Figures 3-4 and line of Figure 5, and the evaluation claims are checked on it alone. It is also
evaluated for every Table 2 model (one more Table 2 column) and runs every TTS setting (one more Table 3
column, outside Overall and delta; one more row of Figure 6 panels; the TTS claims checked on it alone):
the example results have no TTS run on VitaBench, so a test writes them.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml

from envace.common.config import (
    ConfigError,
    eval_hash,
    eval_seeds,
    evaluation_pairs,
    figure5_models,
    load_config,
    ours_benchmarks,
    tts_benchmarks,
    tts_hash,
)
from envace.common.results import eval_path, read_results, tts_path, write_results
from envace.report.context import ReportContext
from envace.report.diff import ON_OURS, claim_results
from envace.report.figures import FIGURES
from envace.report.tables import build_table1, build_table2, build_table3, to_markdown
from envace.serve.eval_plan import task_limit

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


def test_every_table_model_and_checkpoint_is_evaluated_on_ours(ours_cfg: dict) -> None:
    pairs = set(evaluation_pairs(ours_cfg))
    tables = [*ours_cfg["evaluation"]["table1"]["models"], *ours_cfg["evaluation"]["table2"]["models"]]
    for model in [*tables, *figure5_models(ours_cfg).values()]:
        assert (model, "vitabench") in pairs
    # the example config has VitaBench as a Table 1 benchmark: the same pairs, plus the checkpoints' and
    # Table 2's
    table2 = ours_cfg["evaluation"]["table2"]["models"]
    extra = {(m, "vitabench") for m in [*figure5_models(ours_cfg).values(), *table2]}
    assert pairs == set(evaluation_pairs(load_config(EXAMPLE_CONFIG))) | extra
    assert tts_benchmarks(ours_cfg) == [*ours_cfg["tts"]["benchmarks"], "vitabench"]


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
    # no TTS run on VitaBench in the example results: its TTS claims are MISSING, not checked elsewhere
    assert results["parallel_tts_helps@vitabench"]["status"] == "MISSING"
    ours = results["rehearsal_beats_grpo@vitabench"]
    assert ours["comparisons"][0]["comparison"] == "envace_8b - grpo_8b on vitabench"
    assert "ours" in ours["text"]
    paper = results["rehearsal_beats_grpo"]
    assert paper["comparisons"][0]["comparison"] == "envace_8b - grpo_8b on tau2"


def _tts_on_ours(cfg: dict, results: Path, score_of: dict[str, float]) -> None:
    """Every TTS setting's run on VitaBench, written as ``envace eval`` would (valid manifest): the
    tasks of envace_8b's VitaBench evaluation, each scored ``score_of[setting]``."""
    for setting in cfg["tts"]["settings"]:
        for seed in cfg["tts"]["seeds"]:
            old = read_results(eval_path(EXAMPLE_RESULTS, "envace_8b", "vitabench", seed)).lines
            lines = [{**line, "score": score_of[setting], "status": "ok", "reason": None} for line in old]
            write_results(tts_path(results, setting, "vitabench", seed), lines,
                          model=setting, benchmark="vitabench", seed=seed, scale=cfg["scale"],
                          config_hash=tts_hash(cfg, setting, "vitabench"), git_commit="test",
                          package_versions={})


def test_tables_2_3_figure6_and_tts_claims_on_ours(ours_cfg: dict, results_copy: Path) -> None:
    """Table 2 gets a column per ours benchmark; Table 3 one more (outside Overall and delta); Figure 6
    one more row of panels; the TTS claims are checked on ours alone."""
    import matplotlib.pyplot as plt

    score_of = {s: 1.0 if s.endswith("_envace") else 0.0 for s in ours_cfg["tts"]["settings"]}
    _tts_on_ours(ours_cfg, results_copy, score_of)
    ctx = ReportContext(ours_cfg, results_copy, resamples=200)

    table2 = build_table2(ctx)
    assert table2.columns[-1] == "vitabench"
    row = next(r for r in table2.rows if r.key == "envace_8b")
    evaluated = ctx.mean("eval", "envace_8b", ["vitabench"])
    assert evaluated.ok and row.cells["vitabench"].interval.point == evaluated.interval.point
    assert "not a paper benchmark" in to_markdown(table2, "header")

    table3 = build_table3(ctx)
    assert table3.columns == [*ours_cfg["tts"]["benchmarks"], "overall", "delta", "vitabench"]
    rows = {r.key: r for r in table3.rows}
    assert rows["parallel_envace"].cells["vitabench"].interval.point == pytest.approx(100.0)
    assert rows["no_tts"].cells["vitabench"].interval.point == pytest.approx(0.0)
    tts = ours_cfg["tts"]
    paper_overall = ctx.mean("tts", tts["table3"]["parallel_envace"], tts["benchmarks"])
    assert rows["parallel_envace"].cells["overall"].interval.point == paper_overall.interval.point

    fig = plt.figure()
    FIGURES["fig6"](ctx, fig)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    modes = ours_cfg["tts"]["modes"]
    assert titles == [*modes, *(f"{m}, vitabench (ours)" for m in modes)]
    plt.close(fig)

    claims = {c["id"]: c for c in claim_results(ctx)}
    helps = claims["parallel_tts_helps@vitabench"]
    assert helps["comparisons"][0]["comparison"] == "parallel_n2_envace - no_tts on vitabench"
    assert helps["comparisons"][0]["point"] == pytest.approx(100.0)
    assert claims["parallel_tts_helps"]["comparisons"][0]["comparison"].endswith("on TTS Overall")


def test_tts_limit_caps_tasks_in_tts_runs_only(ours_cfg: dict) -> None:
    cfg = copy.deepcopy(ours_cfg)
    cfg["benchmarks"]["vitabench"]["limit"] = 3
    assert (task_limit(cfg, "vitabench", tts=False), task_limit(cfg, "vitabench", tts=True)) == (3, 3)
    cfg["tts"]["limit"] = 2
    assert (task_limit(cfg, "vitabench", tts=False), task_limit(cfg, "vitabench", tts=True)) == (3, 2)
    del cfg["benchmarks"]["vitabench"]["limit"]
    assert (task_limit(cfg, "vitabench", tts=False), task_limit(cfg, "vitabench", tts=True)) == (None, 2)
    # tts.limit is part of every TTS run's hash (it changes the samples), not of an evaluation's
    assert tts_hash(cfg, "no_tts", "vitabench") != tts_hash(ours_cfg, "no_tts", "vitabench")


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    raw = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    for ours, message in ((["no_such_bench"], "evaluation.ours_benchmarks' names unknown benchmark"),
                          (["tau2"], "in both evaluation.ours_benchmarks and evaluation.table1.benchmarks"),
                          (["bfcl_multi_turn"], "in both evaluation.ours_benchmarks and tts.benchmarks")):
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


def test_learning_seeds_are_read_by_the_learning_check_alone(ours_cfg: dict, results_copy: Path) -> None:
    """report.learning.seeds: the check's models are averaged over those seeds (here a third, written
    for the base and the trained model), while tables and every other cell keep the config's seeds."""
    from envace.report.diff import build_diff, learning_results, to_markdown

    cfg = copy.deepcopy(ours_cfg)
    cfg["report"]["learning"] = {"base": "qwen3_8b", "models": ["envace_8b"], "seeds": [0, 1, 2]}
    for name in ("qwen3_8b", "envace_8b"):
        for seed in (0, 1, 2):
            old = read_results(eval_path(EXAMPLE_RESULTS, name, "vitabench", min(seed, 1)))
            score = 1.0 if (name, seed) == ("envace_8b", 2) else 0.0
            lines = [{**line, "seed": seed, "score": score, "status": "ok", "reason": None}
                     for line in old.lines]
            write_results(eval_path(results_copy, name, "vitabench", seed), lines, model=name,
                          benchmark="vitabench", seed=seed, scale=cfg["scale"],
                          config_hash=eval_hash(cfg, name, "vitabench"), git_commit="test",
                          package_versions={})
    ctx = ReportContext(cfg, results_copy, resamples=200)
    (entry,) = learning_results(ctx)
    assert entry["seeds"] == [0, 1, 2]
    assert entry["trained"] == entry["point"] == pytest.approx(100 / 3) and entry["base"] == 0
    assert ctx.mean("eval", "envace_8b", ["vitabench"]).interval.point == 0  # the tables' seeds 0 and 1
    assert "Avg@3: evaluation seeds 0, 1, 2." in to_markdown(build_diff(ctx))
    assert eval_seeds(cfg, "envace_8b", "vitabench") == [0, 1, 2]
    assert eval_seeds(cfg, "grpo_8b", "vitabench") == eval_seeds(cfg, "envace_8b", "tau2") == [0, 1]


def test_learning_seeds_beyond_the_config_seeds_need_the_one_job_evaluation(tmp_path: Path) -> None:
    raw = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    raw["report"]["learning"] = {"base": "qwen3_8b", "models": ["envace_8b"], "seeds": [0, 1, 2, 3]}
    raw["evaluation"]["one_job"] = False
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"'report\.learning\.seeds' adds seeds \[2, 3\]"):
        load_config(path)
    raw["report"]["learning"]["seeds"] = [1, 0]  # a subset of seeds: any evaluation layout
    path.write_text(yaml.safe_dump(raw))
    assert load_config(path)["report"]["learning"]["seeds"] == [1, 0]


def test_learning_names_an_unknown_model(tmp_path: Path) -> None:
    raw = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    raw["report"]["learning"] = {"base": "qwen3_8b", "models": ["envace_99b"]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"report\.learning' names unknown Table 1 model 'envace_99b'"):
        load_config(path)


def test_fidelity_trajectories_must_be_a_table1_model(tmp_path: Path) -> None:
    """report.fidelity.trajectories: its evaluation files are every fidelity run's input, so it must be a
    model that Table 1 evaluates."""
    raw = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    rehearse = {"prompt": "rehearsal_v2", "max_tokens": 8, "max_context_tokens": 64, "temperature": 0.0,
                "seed": 0, "enable_thinking": False}
    raw["report"]["fidelity"] = {"models": ["qwen3_8b"], "benchmarks": ["vitabench"],
                                 "trajectories": "envace_99b", "rehearse": rehearse}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"report\.fidelity\.trajectories' names unknown Table 1 model"):
        load_config(path)
    raw["report"]["fidelity"]["trajectories"] = raw["evaluation"]["table1"]["models"][0]
    path.write_text(yaml.safe_dump(raw))
    assert load_config(path)["report"]["fidelity"]["trajectories"] == raw["evaluation"]["table1"]["models"][0]


def test_fidelity_contrasts_and_fig5_runs_name_known_ones(tmp_path: Path) -> None:
    """report.fidelity.contrasts: both models among report.fidelity.models; report.fig5_rehearse_runs:
    training runs."""
    raw = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    rehearse = {"prompt": "rehearsal_v2", "max_tokens": 8, "max_context_tokens": 64, "temperature": 0.0,
                "seed": 0, "enable_thinking": False}
    raw["report"]["fidelity"] = {"models": ["qwen3_8b", "envace_8b"], "benchmarks": ["vitabench"],
                                 "contrasts": [["envace_8b", "grpo_8b"]], "rehearse": rehearse}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"report\.fidelity\.contrasts' names unknown model 'grpo_8b'"):
        load_config(path)
    raw["report"]["fidelity"]["contrasts"] = [["envace_8b", "qwen3_8b"]]
    raw["report"]["fig5_rehearse_runs"] = ["envace_8b", "qwen3_8b"]
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"fig5_rehearse_runs' names unknown training run 'qwen3_8b'"):
        load_config(path)
    raw["report"]["fig5_rehearse_runs"] = ["envace_8b"]
    path.write_text(yaml.safe_dump(raw))
    assert load_config(path)["report"]["fidelity"]["contrasts"] == [["envace_8b", "qwen3_8b"]]
