"""Launch verl training for one run (GPU path) — :func:`launch`, called by ``envace train``.

Implemented: the ``python -m verl.trainer.main_ppo`` command line (:func:`build_command`: our Hydra file
via ``--config-path/--config-name`` plus overrides from ``config.yaml``), the environment
(``VERL_USE_EXTERNAL_MODULES=envace.verl_ext`` so every Ray process registers our extension), resume
(``trainer.resume_mode=auto`` on the run's checkpoint dir, which Snakemake does not own), a check after
the driver exits that the last checkpointed step advanced (verl PR #5725: a resume at an epoch boundary
could run 0 steps and exit 0), and the done-file written atomically. On a multi-node run inside Slurm the
driver runs under ``scripts/ray_slurm_launch.sh`` (Ray head + workers, node/GPU checks, teardown).
A per-role run (``roles: per_role``) launches the same driver with ``per_role_8b.yaml`` (trainer mode
``envace_per_role_sync``, two policies; see :mod:`envace.verl_ext.per_role_trainer`); the Ray cluster
spans all of the run's ``nodes``, which the overrides split between the two policies. A run whose GPUs
cannot be split evenly exits 2 with the reason.
Verified on CPU: the command line, the environment and the step check (tests/verl_ext); the driver
itself needs GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envace.verl_ext.compose import CONFIG_DIR, run_config_name, run_overrides

__all__ = ["build_command", "build_env", "last_step", "launch"]

SLURM_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ray_slurm_launch.sh"


def build_command(cfg: Mapping[str, Any], run: str, checkpoint_dir: str) -> list[str]:
    """argv of the verl driver for ``run``; multi-node runs inside Slurm go through the Ray launcher."""
    spec = cfg["training"]["runs"][run]
    data = f"{cfg['paths']['data']}/cm2_train.parquet"
    argv = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        f"--config-path={CONFIG_DIR}",
        f"--config-name={run_config_name(cfg, run)}",
        *run_overrides(cfg, run, checkpoint_dir, train_files=data),
    ]
    if int(spec["nodes"]) > 1 and os.environ.get("SLURM_JOB_ID"):
        argv = [
            "bash",
            str(SLURM_SCRIPT),
            "--gpus-per-node",
            str(spec["gpus_per_node"]),
            "--nodes",
            str(spec["nodes"]),
            "--",
            *argv,
        ]
    return argv


def build_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's environment: ``VERL_USE_EXTERNAL_MODULES`` gains ``envace.verl_ext``."""
    env = dict(os.environ if base is None else base)
    mods = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    if "envace.verl_ext" not in mods:
        mods.append("envace.verl_ext")
    env["VERL_USE_EXTERNAL_MODULES"] = ",".join(mods)
    return env


def last_step(checkpoint_dir: str | Path) -> int:
    """verl's last checkpointed step (``latest_checkpointed_iteration.txt``), 0 if none."""
    f = Path(checkpoint_dir) / "latest_checkpointed_iteration.txt"
    return int(f.read_text().strip()) if f.exists() else 0


def launch(cfg: dict, run: str, checkpoint_dir: str, done: str) -> int:
    """Run verl training for ``run``; returns the exit status (non-zero if the step did not advance)."""
    try:
        argv = build_command(cfg, run, checkpoint_dir)
    except ValueError as exc:  # e.g. a per-role run whose GPUs cannot be split between its two policies
        print(f"envace train: run {run}: {exc}", file=sys.stderr)
        return 2
    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    before = last_step(checkpoint_dir)
    total = int(cfg["training"]["runs"][run]["total_steps"])
    if before < total:
        rc = subprocess.call(argv, env=build_env())
        if rc != 0:
            return rc
    after = last_step(checkpoint_dir)
    if after <= before and before < total:
        print(f"envace train: resumed at step {before} but no new checkpoint was written", file=sys.stderr)
        return 1
    payload = {"run": run, "last_step": after, "resumed_from": before, "checkpoint_dir": checkpoint_dir}
    Path(done).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=Path(done).parent, delete=False, suffix=".tmp") as fh:
        json.dump(payload, fh, indent=1)
    os.replace(fh.name, done)
    return 0 if after >= total else 1
