"""``scripts/gpu_check.sh``, the check for a lent GPU, composed without running it (``--dry-run``).

What the smoke run's training checks (verl's ``main_ppo`` for every run, both roles' rows, rollout-vs-actor
agreement, checkpoints with HF weights, a checkpoint served by ``vllm serve``) is
``benchmarks/check_smoke_training.py``'s, on the smoke DAG that CI runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def test_gpu_check_script_dry_run(tmp_path):
    """scripts/gpu_check.sh (for a lent GPU) composes its stages: the node's preflight, then the four of the
    paper path (--cpu: those four on verl's CPU)."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "WORK": str(tmp_path)}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("[dry-run]") == 5 and "train --config" in out.stdout
    assert "-m envace.serve.gpu_stack" in out.stdout.splitlines()[0]  # the node's preflight first
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert {r["gpus_per_node"] for r in cfg["training"]["runs"].values()} == {1}
    assert {r["total_steps"] for r in cfg["training"]["runs"].values()} == {2}
