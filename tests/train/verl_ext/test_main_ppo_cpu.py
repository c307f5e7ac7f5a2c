"""verl 0.9.1's real ``main_ppo`` on this CPU through ``envace train`` (no stand-ins): the EnvACE run and
the standard-GRPO run with its simulator served by ``vllm serve``.

Inputs are built in a temporary folder from the project's fixtures: the tiny Qwen3-architecture model,
warm-started on the CM2 fixture records (``envace tiny-model``; without the warm start it makes no tool
call, so no REHEARSE row), the training parquet (``envace data``) and ``config/smoke.yaml`` with fewer
steps. What each test reads is verl's own console step lines (``step:N - key:value - ...``) and the
checkpoint folder verl writes. About 3 minutes per run on 2 cores (start-up of Ray, FSDP and vLLM).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
STEP = re.compile(r"step:(\d+) - (.*)")

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}


def _run(argv: list[str], log: Path, timeout: int = 1200) -> int:
    with open(log, "w") as fh:
        return subprocess.call(argv, stdout=fh, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT,
                               timeout=timeout)


def step_metrics(log: Path) -> dict[int, dict[str, str]]:
    """verl's console logger lines: ``{step: {metric: value}}``."""
    out: dict[int, dict[str, str]] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = STEP.search(line)
        if m:
            pairs = (kv.rsplit(":", 1) for kv in m.group(2).split(" - ") if ":" in kv)
            out[int(m.group(1))] = {k.strip(): v.strip() for k, v in pairs}
    return out


def _num(value: str) -> float:
    m = re.search(r"-?\d+(\.\d+)?(e-?\d+)?", value)
    assert m, value
    return float(m.group(0))


@pytest.fixture(scope="module")
def smoke_inputs(tmp_path_factory, warm_tiny_model) -> dict[str, Path]:
    """The warm-started tiny model, the CM2 fixture parquet and a 2-step smoke config, in a temp folder."""
    work = tmp_path_factory.mktemp("main_ppo")
    cfg = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    model, data = warm_tiny_model, work / "data"
    cfg["paths"] = {k: str(work / k) for k in cfg["paths"]}
    cfg["paths"]["data"] = str(data)
    for name, run in cfg["training"]["runs"].items():
        run.update(base_model=str(model), total_steps=2, save_every=2, val_every=2)
        if run["algorithm"] == "envace":
            # GRPO advantages are zero in a group whose rewards are all equal, and with the warm-started
            # model most groups are (per prompt it nearly always or never succeeds): 2 prompts x 2
            # rollouts had no learning step about one run in ten (CI, stop 20), 2 x 4 failed again
            # (CI, stop 26; step 1 here scored 0.5 and 1.0 with all advantages 0). 4 prompts x 8
            # rollouts: 8 groups over 8 of the fixture's 9 prompts
            run.update(prompts_per_step=4, rollouts_per_prompt=8)
        if run.get("simulator"):
            run["simulator"] = str(model)
        cfg["training"]["runs"][name] = run
    cfg["training"]["judge"]["model"] = str(model)
    cfg["evaluation"]["checkpoints"]["steps"] = [2]
    config = work / "config.json"
    config.write_text(json.dumps(cfg))
    rc = _run([str(BIN / "envace"), "data", "--config", str(config), "--out", str(data / "cm2_train.parquet"),
               "--summary", str(data / "summary.json")], work / "data.log")
    assert rc == 0, (work / "data.log").read_text()[-3000:]
    return {"work": work, "config": config, "model": model}


def _train(inputs: dict[str, Path], run: str) -> tuple[int, Path, Path]:
    work = inputs["work"]
    ck, log = work / f"ck_{run}", work / f"{run}.log"
    rc = _run([str(BIN / "envace"), "train", "--config", str(inputs["config"]), "--run", run,
               "--checkpoint-dir", str(ck), "--done", str(work / f"{run}.done.json")], log)
    return rc, ck, log


def test_envace_run_two_steps(smoke_inputs):
    """EnvACE (shared policy): multi-generation trajectories, both roles' rows, non-zero role-wise
    advantages, rollout weights synced to the trained actor, a checkpoint with HF weights."""
    rc, ck, log = _train(smoke_inputs, "envace_8b")
    assert rc == 0, log.read_text()[-5000:]
    steps = step_metrics(log)
    assert sorted(steps) == [1, 2], log.read_text()[-5000:]
    for n, m in steps.items():
        assert _num(m["envace/rows/act"]) >= 1 and _num(m["envace/rows/rehearse"]) >= 1, (n, m)
        assert _num(m["training/rollout_actor_probs_pearson_corr"]) >= 0.99, (n, m)
    # a step whose groups all have equal rewards has zero advantages (GRPO); at least one step learns
    learning = [n for n, m in steps.items()
                if _num(m["critic/advantages/max"]) > 0 > _num(m["critic/advantages/min"])
                and _num(m["actor/grad_norm"]) > 0]
    assert learning, {n: (m["critic/advantages/max"], m["actor/grad_norm"]) for n, m in steps.items()}
    assert (ck / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    hf = ck / "global_step_2" / "actor" / "huggingface"
    assert list(hf.glob("*.safetensors")), sorted(p.name for p in hf.iterdir())
    done = json.loads((smoke_inputs["work"] / "envace_8b.done.json").read_text())
    assert done["last_step"] == 2 and done["resumed_from"] == 0 and done["versions"]["verl"] == "0.9.1"
    logged = [json.loads(line)["step"] for line in (ck / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2]  # verl's file logger, merged by envace.train.verl_ext.launch


def test_grpo_run_with_served_simulator(smoke_inputs):
    """Standard GRPO: ACT rows only; observations from the simulator that `envace train` serves with
    `vllm serve` (its log beside the done-file)."""
    rc, ck, log = _train(smoke_inputs, "grpo_8b")
    assert rc == 0, log.read_text()[-5000:]
    text = log.read_text(errors="replace")
    assert "starting vllm serve" in text and "envace.simulator.base_url=http://" in text
    steps = step_metrics(log)
    assert sorted(steps) == [1, 2]
    for n, m in steps.items():
        assert _num(m["envace/rows/act"]) >= 1 and _num(m["envace/rows/rehearse"]) == 0, (n, m)
    assert (smoke_inputs["work"] / "grpo_8b.simulator.server.log").is_file()


def test_verl_checkpoint_evaluated_through_vllm_serve(smoke_inputs):
    """The step-2 checkpoint of the EnvACE run (its actor/huggingface/ weights) served by `vllm serve`
    and evaluated on the FinMCP fixture (runs after test_envace_run_two_steps)."""
    work = smoke_inputs["work"]
    ck = work / "ck_envace_8b"
    if not (ck / "latest_checkpointed_iteration.txt").is_file():
        pytest.skip("needs the checkpoint of test_envace_run_two_steps")
    cfg = json.loads(smoke_inputs["config"].read_text())
    cfg["benchmarks"]["finmcp"]["limit"] = 2
    config = work / "eval_config.json"
    config.write_text(json.dumps(cfg))
    out, log = work / "eval" / "finmcp_seed0.jsonl", work / "eval.log"
    rc = _run([str(BIN / "envace"), "eval", "--config", str(config), "--model", "envace_8b",
               "--checkpoint-dir", str(ck), "--step", "2", "--benchmark", "finmcp", "--seed", "0",
               "--out", str(out)], log)
    assert rc == 0, log.read_text()[-5000:]
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 2 * int(cfg["benchmarks"]["finmcp"].get("samples", 1))
    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    text = json.dumps(manifest)
    assert "global_step_2" in text and "vllm" in text, manifest


def test_gpu_check_script_dry_run(tmp_path):
    """scripts/gpu_check.sh (for a lent GPU) composes its four stages (--cpu: the same on verl's CPU)."""
    env = {**_env(), "WORK": str(tmp_path)}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("[dry-run]") == 4 and "train --config" in out.stdout
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert {r["gpus_per_node"] for r in cfg["training"]["runs"].values()} == {1}
    assert {r["total_steps"] for r in cfg["training"]["runs"].values()} == {2}
