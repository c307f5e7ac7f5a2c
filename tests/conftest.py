"""Shared fixtures: the repository root, and the warm-started tiny model the real-server tests share."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def warm_tiny_model(tmp_path_factory) -> Path:
    """The smoke model, built once per test session exactly as the smoke DAG builds it (``envace
    tiny-model`` with ``config/smoke.yaml``'s ``tiny_model`` warm start on the CM2 fixture records):
    the tests that run ``vllm serve`` / verl's ``main_ppo`` for real share it (a build is ~2.5 min)."""
    cfg = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    tiny = cfg["tiny_model"]
    out = tmp_path_factory.mktemp("warm_tiny") / "tiny"
    argv = [str(Path(sys.executable).parent / "envace"), "tiny-model", "--out", str(out),
            "--seed", str(tiny["seed"]), "--warmstart-data", cfg["training"]["data"]["source"],
            "--warmstart-steps", str(tiny["warmstart_steps"]), "--warmstart-lr", str(tiny["warmstart_lr"])]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out
