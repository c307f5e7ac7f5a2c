"""Config composition for every run: the paper's values reach the trainer settings, and the plan."""

from __future__ import annotations

import sys
import types

import pytest

from envace.cli import main
from envace.commands.plan import parse_size, plan_rows
from envace.config import load_config
from envace.cpu_trainer import TrainerSettings
from envace.rollout import Mode

PAPER_RUNS = ["envace_8b", "envace_1p7b", "grpo_8b", "grpo_1p7b", "per_role_8b"]


@pytest.fixture(scope="module")
def paper(repo_root):
    return load_config(repo_root / "config" / "config.yaml")


@pytest.fixture(scope="module")
def smoke(repo_root):
    return load_config(repo_root / "config" / "smoke.yaml")


@pytest.mark.parametrize("run", PAPER_RUNS)
def test_paper_values_reach_settings(paper, run):
    s = TrainerSettings.from_config(paper, run)
    # PAPER.md: 470 steps, lr 1e-6, 16 x 4, 12k/8k, 30 turns; authors' script: clip 0.2, dual-clip 3,
    # token-mean, KL coef 1e-4 with the loss off, temperature 1.0, checkpoint every 50; entropy 0.
    assert (s.total_steps, s.lr, s.prompts_per_step, s.rollouts_per_prompt) == (470, 1e-6, 16, 4)
    assert (s.max_prompt_tokens, s.max_response_tokens, s.max_turns) == (12288, 8192, 30)
    assert (s.clip_ratio, s.dual_clip, s.loss_agg_mode, s.entropy_coef) == (0.2, 3.0, "token-mean", 0.0)
    assert (s.use_kl_loss, s.kl_coef) == (False, 1e-4)
    assert (s.rollout_temperature, s.save_every) == (1.0, 50)
    rc = s.rollout_config()
    assert rc.max_turns == 30 and rc.act_sampling["temperature"] == 1.0
    assert rc.max_rehearse_context_tokens == 12288 + 8192


@pytest.mark.parametrize("run, mode, keys", [
    ("envace_8b", Mode.REHEARSAL, ["actor"]),
    ("envace_1p7b", Mode.REHEARSAL, ["actor"]),
    ("grpo_8b", Mode.EXTERNAL_SIMULATOR, ["actor"]),
    ("grpo_1p7b", Mode.EXTERNAL_SIMULATOR, ["actor"]),
    ("per_role_8b", Mode.EXTERNAL_SIMULATOR, ["actor", "rehearse"]),
])
def test_modes_per_run(paper, smoke, run, mode, keys):
    for cfg in (paper, smoke):
        s = TrainerSettings.from_config(cfg, run)
        assert s.rollout_config().mode == mode
        assert s.model_keys == keys


def test_smoke_runs_use_cpu_and_warm_start(smoke):
    assert smoke["training"]["reward"] == "reference_match"
    for run in smoke["training"]["runs"]:
        s = TrainerSettings.from_config(smoke, run)
        assert smoke["training"]["runs"][run]["gpus_per_node"] == 0
        assert s.warmstart_steps == smoke["training"]["cpu_trainer"]["warmstart_steps"]
    # the warm start happens once, when the tiny base model is built, not again in every run
    assert smoke["tiny_model"]["warmstart_steps"] > 0


def test_invalid_combinations_rejected():
    with pytest.raises(ValueError, match="roles must be shared"):
        TrainerSettings(algorithm="grpo", roles="per_role")
    with pytest.raises(ValueError, match="algorithm"):
        TrainerSettings(algorithm="ppo")
    assert TrainerSettings(keep_checkpoints=1).keep_checkpoints == 2


def test_unknown_run(paper):
    with pytest.raises(ValueError, match="unknown run"):
        TrainerSettings.from_config(paper, "nope")


def test_plan_formula(paper):
    rows = {r["run"]: r for r in plan_rows(paper, None, peak_tflops=100.0, mfu=0.5)}
    assert set(rows) == set(PAPER_RUNS)
    r = rows["envace_8b"]
    run = paper["training"]["runs"]["envace_8b"]
    tokens = run["prompts_per_step"] * run["rollouts_per_prompt"] * (run["max_prompt_tokens"]
                                                                      + run["max_response_tokens"])
    assert r["tokens_per_step"] == tokens == 16 * 4 * (12288 + 8192)
    assert r["params"] == 8e9
    assert r["gpu_hours"] == pytest.approx(470 * 8 * 8e9 * tokens / (100e12 * 0.5) / 3600)
    assert r["gpus"] == 16 and r["wall_hours"] == pytest.approx(r["gpu_hours"] / 16)
    assert rows["envace_1p7b"]["params"] == pytest.approx(1.7e9)


def test_parse_size():
    assert parse_size("8B") == 8e9
    assert parse_size("Qwen/Qwen3-1.7B") == pytest.approx(1.7e9)
    assert parse_size("models/smoke/tiny") is None


def test_plan_cli(repo_root, capsys):
    assert main(["plan", "--config", str(repo_root / "config" / "config.yaml")]) == 0
    out = capsys.readouterr().out
    assert all(run in out for run in PAPER_RUNS) and "all" in out and "MFU 30%" in out


def test_train_cli_gpu_run_hands_over_to_verl_ext(repo_root, tmp_path, monkeypatch):
    """gpus_per_node > 0: ``envace train`` calls envace.verl_ext.launch.launch(cfg, run, ckpt, done)."""
    calls = []
    fake = types.ModuleType("envace.verl_ext.launch")
    fake.launch = lambda cfg, run, ckpt, done: calls.append((cfg["scale"], run, ckpt, done)) or 7
    monkeypatch.setitem(sys.modules, "envace.verl_ext.launch", fake)
    argv = ["train", "--config", str(repo_root / "config" / "config.yaml"), "--run", "grpo_8b",
            "--checkpoint-dir", str(tmp_path / "ck"), "--done", str(tmp_path / "done.json")]
    assert main(argv) == 7
    assert calls == [("paper", "grpo_8b", str(tmp_path / "ck"), str(tmp_path / "done.json"))]


def test_train_cli_gpu_run_without_verl_ext(repo_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "envace.verl_ext.launch", None)  # import raises ImportError
    rc = main(["train", "--config", str(repo_root / "config" / "config.yaml"), "--run", "envace_8b",
               "--checkpoint-dir", str(tmp_path / "ck"), "--done", str(tmp_path / "done.json")])
    assert rc == 1
    assert "envace.verl_ext.launch" in capsys.readouterr().err
    assert not (tmp_path / "done.json").exists()
