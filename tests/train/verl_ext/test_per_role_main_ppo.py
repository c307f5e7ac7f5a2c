"""The per-role run's guard through verl 0.9.1's real ``main_ppo`` on CPU: the negative control.

What a healthy per-role run must show (both roles' rows and updates at every step, both policies' rollout
servers serving their weights: agreement >= 0.99 per role and step, both policies checkpointed at every
saved step, the resume of both from one step after ``scancel``) is checked on the smoke DAG that CI runs
through Slurm (``benchmarks/check_smoke_training.py``, ``benchmarks/faults.py``). What that run cannot
show is the guard stopping a broken one: with the test switch ``ENVACE_TEST_SKIP_REHEARSE_SYNC=all`` the
REHEARSE server keeps its dummy initial weights (the defect the guard exists for) and the run must stop
at step 1 with ``RolloutAgreementError``, before saving a checkpoint. Slow (one ``main_ppo`` start, ~3
minutes on 2 cores): marked ``slow``. Inputs are built in a temporary directory the way the workflow
builds them (``workflow/rules/data.smk``): the tiny model with its warm start (``envace tiny-model``), the
training parquet (``envace data``) and a resolved config derived from ``config/smoke.yaml``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from envace.common.config import load_config

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
ENVACE = [str(BIN / "envace")]
RUN = "per_role_8b"
TIMEOUT_S = 900

pytestmark = pytest.mark.slow


def _run(argv: list[str], log: Path, env: dict[str, str] | None = None, timeout: int = TIMEOUT_S) -> int:
    """Run ``argv`` (its own local Ray cluster, which the driver shuts down; never ``ray stop``, which
    would also stop other runs' clusters on this machine)."""
    with open(log, "w") as fh:
        return subprocess.call(argv, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout,
                               env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **(env or {})})


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, warm_tiny_model: Path) -> dict[str, Any]:
    """The session's warm-started tiny model, training parquet and a resolved smoke config for a 2-step
    ``per_role_8b``."""
    tmp = tmp_path_factory.mktemp("per_role_main_ppo")
    cfg = load_config(ROOT / "config" / "smoke.yaml")
    model = warm_tiny_model
    source = str(ROOT / cfg["training"]["data"]["source"])

    cfg["paths"] = {k: str(tmp / k) for k in cfg["paths"]}
    for entry in cfg["models"].values():
        if entry.get("kind") == "tiny":
            entry["path"] = str(model)
    cfg["training"]["judge"]["model"] = str(model)
    cfg["training"]["data"]["source"] = source
    for run in cfg["training"]["runs"].values():
        run["base_model"] = str(model)
        if run.get("simulator"):
            run["simulator"] = str(model)
    run = cfg["training"]["runs"][RUN]
    run.update(total_steps=2, save_every=1, val_every=100)
    config = tmp / "config.resolved.json"
    config.write_text(json.dumps(cfg, indent=1))

    data = tmp / "data" / "cm2_train.parquet"
    data.parent.mkdir(parents=True)
    argv = [*ENVACE, "data", "--config", str(config), "--out", str(data),
            "--summary", str(tmp / "summary.json")]
    assert _run(argv, tmp / "data.log", timeout=600) == 0, (tmp / "data.log").read_text()[-3000:]
    return {"tmp": tmp, "cfg": cfg, "config": config, "data": data}


def _train(inputs: dict[str, Any], name: str, total_steps: int, env: dict[str, str] | None = None,
           ckpt: Path | None = None) -> tuple[int, str, float, Path]:
    tmp = inputs["tmp"]
    cfg = json.loads(inputs["config"].read_text())
    cfg["training"]["runs"][RUN]["total_steps"] = total_steps
    config = tmp / f"{name}.config.json"
    config.write_text(json.dumps(cfg, indent=1))
    ckpt = ckpt or tmp / name / "ck"
    log = tmp / f"{name}.log"
    argv = [*ENVACE, "train", "--config", str(config), "--run", RUN, "--checkpoint-dir", str(ckpt),
            "--done", str(tmp / name / "done.json"), "--data", str(inputs["data"])]
    t0 = time.monotonic()
    rc = _run(argv, log, env=env)
    return rc, log.read_text(errors="replace"), time.monotonic() - t0, ckpt


def test_guard_stops_a_run_whose_rehearse_server_is_not_synced(inputs: dict[str, Any]) -> None:
    rc, log, seconds, ckpt = _train(inputs, "unsynced", total_steps=2,
                                    env={"ENVACE_TEST_SKIP_REHEARSE_SYNC": "all"})
    m = re.search(r"rehearse: rehearse/training/rollout_actor_probs_pearson_corr = ([-0-9.e]+|nan)", log)
    print(f"negative control: rc {rc} after {seconds:.0f} s; REHEARSE correlation {m and m.group(1)}")
    assert rc != 0
    assert "RolloutAgreementError" in log and m, log[-6000:]
    assert not (ckpt / "global_step_1").exists()  # stopped before saving a checkpoint of step 1
