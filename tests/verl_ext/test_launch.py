"""Generated command lines, environment, resume check, and the Slurm launcher in dry-run mode."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from envace.config import load_config
from envace.verl_ext import launch as L

CFG = load_config("config/config.yaml")
ROOT = Path(__file__).resolve().parents[2]


def test_command_line(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    argv = L.build_command(CFG, "envace_8b", "/ck/envace_8b")
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert "--config-name=envace_8b" in argv and "trainer.resume_mode=auto" in argv
    assert "trainer.default_local_dir=/ck/envace_8b" in argv
    assert f"data.train_files={CFG['paths']['data']}/cm2_train.parquet" in argv


def test_multinode_goes_through_slurm_launcher(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    argv = L.build_command(CFG, "envace_8b", "/ck")
    assert argv[:2] == ["bash", str(L.SLURM_SCRIPT)] and "--" in argv
    assert L.build_command(CFG, "envace_1p7b", "/ck")[1] == "-m"  # one node: no Ray launcher


def test_env_adds_external_module():
    env = L.build_env({"VERL_USE_EXTERNAL_MODULES": "other"})
    assert env["VERL_USE_EXTERNAL_MODULES"] == "other,envace.verl_ext"
    assert L.build_env(env)["VERL_USE_EXTERNAL_MODULES"] == "other,envace.verl_ext"


def test_per_role_refused(tmp_path):
    assert L.launch(CFG, "per_role_8b", str(tmp_path / "ck"), str(tmp_path / "done.json")) == 2


def test_resume_must_advance(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "latest_checkpointed_iteration.txt").write_text("50")
    calls = []
    monkeypatch.setattr(L.subprocess, "call", lambda argv, env: calls.append(argv) or 0)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    done = tmp_path / "done.json"
    assert L.launch(CFG, "envace_8b", str(ck), str(done)) == 1 and calls and not done.exists()

    def finish(argv, env):
        (ck / "latest_checkpointed_iteration.txt").write_text("470")
        return 0

    monkeypatch.setattr(L.subprocess, "call", finish)
    assert L.launch(CFG, "envace_8b", str(ck), str(done)) == 0
    assert json.loads(done.read_text()) == {
        "run": "envace_8b",
        "last_step": 470,
        "resumed_from": 50,
        "checkpoint_dir": str(ck),
    }


@pytest.fixture
def fake_slurm(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'n1\\nn2\\n'\n")
    (bin_dir / "scontrol").chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_CPUS_ON_NODE": "16",
        "RAY_START_WAIT": "0",
    }


def test_slurm_script_dry_run(fake_slurm):
    script = str(ROOT / "scripts" / "ray_slurm_launch.sh")
    p = subprocess.run(
        ["bash", script, "--nodes", "2", "--gpus-per-node", "8", "--dry-run", "--", "echo", "hi"],
        env=fake_slurm,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "ray start --head --node-ip-address=n1" in out and "--num-gpus=8" in out and "--num-cpus=16" in out
    assert "-w n2 ray start --address=n1:6379" in out
    assert "+ echo hi" in out and out.count("ray stop --force") == 2
    bad = subprocess.run(
        ["bash", script, "--nodes", "3", "--gpus-per-node", "8", "--dry-run", "--", "true"],
        env=fake_slurm,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 3 and "has 2 nodes" in bad.stderr
