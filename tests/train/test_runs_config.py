"""Every run at both scales goes to verl; the compute plan (the paper values themselves:
tests/train/verl_ext)."""

from __future__ import annotations

import pytest

from envace.cli.main import main
from envace.cli.plan import parse_size, plan_rows
from envace.common.config import load_config

PAPER_RUNS = ["envace_8b", "envace_1p7b", "grpo_8b", "grpo_1p7b", "per_role_8b"]


@pytest.fixture(scope="module")
def paper(repo_root):
    return load_config(repo_root / "config" / "config.yaml")


@pytest.fixture(scope="module")
def smoke(repo_root):
    return load_config(repo_root / "config" / "smoke.yaml")


def test_smoke_runs_are_cpu_runs_of_the_same_matrix(paper, smoke):
    """Smoke scale = the paper's five runs on verl's CPU platform (gpus_per_node 0), warm start once."""
    assert set(smoke["training"]["runs"]) == set(paper["training"]["runs"]) == set(PAPER_RUNS)
    assert smoke["training"]["reward"] == "reference_match"
    for run, spec in smoke["training"]["runs"].items():
        assert spec["gpus_per_node"] == 0, run
        paper_spec = paper["training"]["runs"][run]
        assert (spec["algorithm"], spec["roles"]) == (paper_spec["algorithm"], paper_spec["roles"]), run
    # the warm start happens once, when the tiny base model is built, not again in every run
    assert smoke["tiny_model"]["warmstart"]


def test_plan_formula(paper):
    rows = {r["run"]: r for r in plan_rows(paper, None, peak_tflops=100.0, mfu=0.5)}
    assert set(rows) == set(PAPER_RUNS)
    r = rows["envace_8b"]
    run = paper["training"]["runs"]["envace_8b"]
    tokens = run["prompts_per_step"] * run["rollouts_per_prompt"] * (run["max_prompt_tokens"]
                                                                      + run["max_response_tokens"])
    assert r["tokens_per_step"] == tokens == 16 * 4 * (12000 + 8000)
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


@pytest.mark.parametrize("config", ["config.yaml", "smoke.yaml"])
def test_train_cli_hands_over_to_verl_at_every_scale(repo_root, tmp_path, monkeypatch, config):
    """``envace train`` calls envace.train.verl_ext.launch.launch(cfg, run, ckpt, done, data=...) at both
    scales."""
    from envace.train.verl_ext import launch as L

    calls = []
    monkeypatch.setattr(L, "launch", lambda cfg, run, ckpt, done, data=None:
                        calls.append((cfg["scale"], run, ckpt, done, data)) or 7)
    argv = ["train", "--config", str(repo_root / "config" / config), "--run", "grpo_8b",
            "--checkpoint-dir", str(tmp_path / "ck"), "--done", str(tmp_path / "done.json")]
    assert main(argv) == 7
    scale = "paper" if config == "config.yaml" else "smoke"
    assert calls == [(scale, "grpo_8b", str(tmp_path / "ck"), str(tmp_path / "done.json"), None)]


def test_plan_of_a_target_sums_the_slurm_reservation_of_its_jobs(repo_root, capsys, monkeypatch):
    """`envace plan --target released`: Snakemake's own plan with the Slurm profile; per rule its jobs,
    GPUs and time limit, no training job (the released weights are evaluated, never trained)."""
    from envace.cli.plan import job_reservations

    plan = ("[Sun]\nrule train:\n    resources: tmpdir=/tmp, nodes=2, gres=gpu:8, runtime=4320\n"
            "[Sun]\nrule evaluate_x:\n    resources: mem_mb=1, gpu=5, runtime=120\n"
            "[Sun]\nlocalrule report:\n    resources: tmpdir=/tmp\n")
    assert job_reservations(plan) == [{"rule": "train", "gpus": 16, "hours": 72.0},
                                      {"rule": "evaluate_x", "gpus": 5, "hours": 2.0}]
    monkeypatch.chdir(repo_root)
    assert main(["plan", "--target", "released"]) == 0
    out = capsys.readouterr().out.split("# target released")[1]
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:] if line.strip()}
    assert rows["evaluate_released_envace_8b_released"] == ["1", "5", "48", "240.0"]  # 8B + 30B simulator
    assert "train" not in rows and float(rows["all"][1]) >= 480
