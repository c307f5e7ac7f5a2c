"""Config loading and validation: both shipped configs pass; malformed ones fail naming the key."""

import copy
import re

import pytest
import yaml

from envace.common.config import (
    ConfigError,
    complete_config,
    config_hash,
    eval_hash,
    evaluation_pairs,
    figure5_models,
    load_config,
    schema,
)

PAPER = "config/config.yaml"
SMOKE = "config/smoke.yaml"


@pytest.fixture(scope="module")
def paper(repo_root):
    return load_config(repo_root / PAPER)


def _leaves(node):
    return [x for v in node.values() for x in _leaves(v)] if isinstance(node, dict) else [node]


def test_shipped_configs_validate(repo_root):
    paper = load_config(repo_root / PAPER)
    smoke = load_config(repo_root / SMOKE)
    assert paper["scale"] == "paper" and smoke["scale"] == "smoke"
    # the smoke config is the same experiment matrix, only smaller
    assert set(paper["models"]) == set(smoke["models"])
    assert set(paper["training"]["runs"]) == set(smoke["training"]["runs"])
    # smoke runs a subset of Table 1 (the rows the figures need, no VitaBench), in the paper's order
    paper_rows, smoke_rows = paper["evaluation"]["table1"]["models"], smoke["evaluation"]["table1"]["models"]
    assert smoke_rows == [m for m in paper_rows if m in smoke_rows]
    figure_models = {m for fig in ("fig3", "fig4") for m in _leaves(smoke["report"][fig])}
    assert figure_models <= set(smoke_rows)
    smoke_benchmarks = set(smoke["evaluation"]["table1"]["benchmarks"])
    assert smoke_benchmarks <= set(paper["evaluation"]["table1"]["benchmarks"])
    assert paper["tts"]["settings"] == smoke["tts"]["settings"]
    assert set(paper["benchmarks"]) == set(smoke["benchmarks"])


def test_paper_hyperparameters(paper):
    run = paper["training"]["runs"]["envace_8b"]
    assert run["base_model"] == "Qwen/Qwen3-8B"
    assert run["total_steps"] == 470 and run["lr"] == 1e-6
    assert run["prompts_per_step"] * run["rollouts_per_prompt"] == 64
    assert (run["max_prompt_tokens"], run["max_response_tokens"], run["max_turns"]) == (12000, 8000, 30)
    assert (run["clip_ratio"], run["dual_clip"], run["entropy_coef"]) == (0.2, 3.0, 0.0)
    assert run["kl"] == {"use_kl_loss": False, "coef": 1e-4}
    assert paper["seeds"] == [0, 1, 2, 3]
    assert paper["training"]["runs"]["envace_1p7b"]["base_model"] == "Qwen/Qwen3-1.7B"
    assert paper["training"]["runs"]["grpo_8b"]["algorithm"] == "grpo"
    assert paper["training"]["runs"]["per_role_8b"]["roles"] == "per_role"
    assert len(paper["tts"]["settings"]) == 1 + 2 * 3 * 2


def test_every_hyperparameter_cites_its_source():
    """Each training hyperparameter's schema description names paper, authors' script or our choice."""
    run_props = schema()["$defs"]["training_run"]["properties"]
    uncited = [
        k
        for k, v in run_props.items()
        if not re.search(r"paper|authors' script|our", v.get("description", ""))
    ]
    assert uncited == []


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda c: c["training"]["runs"]["envace_8b"].update(lrr=1e-6), "training.runs.envace_8b"),
        (lambda c: c["training"]["runs"]["envace_8b"].update(lr="fast"), "training.runs.envace_8b.lr"),
        (lambda c: c.update(seedz=[0]), "seedz"),
        (lambda c: c["models"]["qwen3_8b"].update(kind="gguf"), "models.qwen3_8b.kind"),
        (lambda c: c["report"]["bootstrap"].pop("seed"), "report.bootstrap"),
        (lambda c: c["evaluation"]["table1"]["models"].append("nope_7b"), "evaluation.table1.models"),
        (lambda c: c["tts"]["table3"].update(no_tts="parallel_n9_envace"), "tts.table3.no_tts"),
    ],
)
def test_malformed_config_names_the_key(repo_root, mutate, key):
    cfg = yaml.safe_load((repo_root / PAPER).read_text())
    bad = copy.deepcopy(cfg)
    mutate(bad)
    with pytest.raises(ConfigError) as err:
        complete_config(bad)
    assert key in str(err.value)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("scale: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_hashes_are_stable_and_specific(paper):
    assert config_hash({"a": 1, "b": 2}) == config_hash({"b": 2, "a": 1})
    h = eval_hash(paper, "envace_8b", "tau2")
    assert h == eval_hash(copy.deepcopy(paper), "envace_8b", "tau2")
    assert h != eval_hash(paper, "envace_8b", "bfcl_v4")
    other = copy.deepcopy(paper)
    other["training"]["runs"]["envace_8b"]["lr"] = 2e-6
    assert eval_hash(other, "envace_8b", "tau2") != h
    assert eval_hash(other, "qwen3_8b", "tau2") == eval_hash(paper, "qwen3_8b", "tau2")
    assert eval_hash(paper, "envace_8b-step0050", "tau2") != h
    with pytest.raises(ConfigError):
        eval_hash(paper, "unknown_model", "tau2")
    # the shared training settings change every trained model, not the base models; the report-only
    # aggregate block changes no sample
    for key, value in (("reward_rules", {"judge_terminated": True}), ("judge", {"model": "other"})):
        changed = copy.deepcopy(paper)
        changed["training"][key] = {**changed["training"][key], **value}
        assert eval_hash(changed, "envace_8b", "tau2") != h, key
        assert eval_hash(changed, "qwen3_8b", "tau2") == eval_hash(paper, "qwen3_8b", "tau2"), key
    report_only = copy.deepcopy(paper)
    report_only["benchmarks"]["finmcp"]["aggregate"]["average"] = "macro"
    assert eval_hash(report_only, "envace_8b", "finmcp") == eval_hash(paper, "envace_8b", "finmcp")


def test_figure5_last_step_is_the_final_model(paper):
    """Figure 5's last step (470 = total_steps) is the final model's evaluation, not a second one of the
    same weights under a checkpoint id; the other steps are checkpoints. A last step that is not the
    run's end stays a checkpoint."""
    points = figure5_models(paper)
    assert points[470] == "envace_8b" and points[50] == "envace_8b-step0050" and len(points) == 10
    pairs = evaluation_pairs(paper)
    assert ("envace_8b", "tau2") in pairs and not any(m == "envace_8b-step0470" for m, _ in pairs)
    shorter = copy.deepcopy(paper)
    shorter["evaluation"]["checkpoints"]["steps"] = [50, 100]
    assert figure5_models(shorter) == {50: "envace_8b-step0050", 100: "envace_8b-step0100"}
    longer = copy.deepcopy(paper)
    longer["training"]["runs"]["envace_8b"]["total_steps"] = 500
    assert figure5_models(longer)[470] == "envace_8b-step0470"


def test_config_files_merge_as_snakemakes_configfile(repo_root, tmp_path):
    """merge_config_files == Snakemake's own update_config over the same files (make smoke's pair, and
    a list and a nested mapping replacing / merging into what the first file has)."""
    import yaml
    from snakemake.utils import update_config

    from envace.common.config import merge_config_files

    extra = tmp_path / "extra.yaml"
    extra.write_text("evaluation: {table1: {models: [qwen3_8b]}, sampling: {max_tokens: 7}}\nnew_key: 1\n")
    files = [repo_root / "config/smoke.yaml", repo_root / "config/smoke_ledger.yaml", extra]
    expected: dict = {}
    for path in files:
        update_config(expected, yaml.safe_load(path.read_text()))
    got = merge_config_files(files)
    assert got == expected
    assert got["evaluation"]["table1"]["models"] == ["qwen3_8b"]
    assert got["evaluation"]["sampling"]["max_tokens"] == 7 and got["evaluation"]["sampling"]["top_p"] == 0.95


def test_a_new_switch_at_its_old_behaviour_keeps_the_run_hash(paper):
    """``episode.rehearse_advantage`` (added after results existed): ``train``, the behaviour before the
    key, hashes like a run without it, so adding the switch leaves results valid; ``zero`` is a new run."""
    from envace.common.config import training_key

    cfg = copy.deepcopy(paper)
    run = cfg["training"]["runs"]["envace_8b"]
    run["episode"].pop("rehearse_advantage", None)
    without = config_hash(training_key(cfg, "envace_8b"))
    run["episode"]["rehearse_advantage"] = "train"
    assert config_hash(training_key(cfg, "envace_8b")) == without
    run["episode"]["rehearse_advantage"] = "zero"
    assert config_hash(training_key(cfg, "envace_8b")) != without
