"""Two nodes for real: ``envace train`` across two Slurm nodes on this machine, through ``sbatch``.

Needs the two-node Slurm of ``scripts/slurm_localhost.sh start --nodes 2`` (root, Debian): nodes
``envace-n1`` / ``envace-n2`` in partition ``two``, each a ``slurmd`` in its own network namespace, host
name and ``/tmp``, talking TCP between 10.199.0.1 and 10.199.0.2 (the rest of the file system and the CPUs
are this machine's: the inputs and checkpoints live under ``.cache/two_nodes/``, shared as on a cluster).
Opt-in (marker ``two_nodes``; ~16 min on 2 cores): ``.venv/bin/python -m pytest -m two_nodes tests/cluster``.

Each training is the cluster's own path at smoke size: ``sbatch -N 2`` runs ``envace train``, which goes
through ``scripts/ray_slurm_launch.sh`` (Ray head on the first node, a Ray worker on the second, both
checked) into verl's ``main_ppo`` with ``trainer.nnodes=2`` on the CPU platform (one fake GPU per node).
Asserted: the job holds both nodes; Ray lists both; verl's FSDP workers run in both nodes' namespaces
(the shared run's FSDP world is 2 ranks: its actor checkpoint has both ranks' shards; the per-role run:
one policy per node); every step logged once, rollout-vs-actor agreement >= 0.99 for every policy at
every step (``benchmarks/check_smoke_training.py``); ``scancel`` after the first checkpoint, then a
resume from it; and after every job no Ray or vLLM process is left in either node's namespace. Failure
paths: a worker node that cannot reach the head ends the job within the join wait (exit 5, naming the
node and the port); a node whose Ray dies mid-run fails the job, leaving nothing running on either
node.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from envace.common.config import load_config

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PARTITION = "two"
NODES = ("envace-n1", "envace-n2")
ADDRESSES = {"envace-n1": "10.199.0.1", "envace-n2": "10.199.0.2"}
JOB_TIMEOUT_S = 1200
SHARED = ROOT / ".cache" / "two_nodes"  # the jobs' inputs and checkpoints (each node's /tmp is its own)
#: processes that must not outlive a job on a node (the slurmd itself lives in the namespace too)
LEFTOVER = re.compile(r"raylet|gcs_server|ray::|ray start|vllm|EngineCore|main_ppo|dashboard")

pytestmark = pytest.mark.two_nodes

_spec = importlib.util.spec_from_file_location("check_smoke_training",
                                               ROOT / "benchmarks" / "check_smoke_training.py")
check_smoke_training = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_smoke_training)


def _out(*argv: str, timeout: int = 60, env: dict[str, str] | None = None) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True, env=env).stdout


@pytest.fixture(scope="module")
def cluster() -> None:
    """The two namespaced nodes are up and idle."""
    try:
        states = dict(line.split() for line in _out("sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %t")
                      .splitlines() if line.strip())
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"no Slurm partition {PARTITION!r} ({exc}): "
                    "run scripts/slurm_localhost.sh start --nodes 2")
    down = {n: states.get(n, "absent") for n in NODES if states.get(n) not in ("idle", "mix")}
    assert not down, f"nodes not idle: {down} (scripts/slurm_localhost.sh start --nodes 2)"


def _processes(node: str) -> list[tuple[str, str]]:
    """(pid, command line) of every process in ``node``'s network namespace."""
    out = []
    for pid in _out("ip", "netns", "pids", node).split():
        try:
            out.append((pid, Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                        .decode(errors="replace")))
        except OSError:
            continue  # ended meanwhile
    return out


def _leftovers() -> dict[str, list[str]]:
    """Per node, the command lines of its namespace's processes that match :data:`LEFTOVER`."""
    return {node: [f"{pid}: {cmd[:160]}" for pid, cmd in _processes(node) if LEFTOVER.search(cmd)]
            for node in NODES}


class _Placement:
    """Which nodes ran a process of verl's FSDP workers (``ray::WorkerDict``), sampled while waiting."""

    def __init__(self) -> None:
        self.workers: set[str] = set()

    def sample(self) -> None:
        self.workers |= {node for node in NODES
                         if any(cmd.startswith("ray::WorkerDict") for _, cmd in _processes(node))}


@pytest.fixture(scope="module")
def inputs(warm_tiny_model: Path, cluster: None) -> dict[str, Any]:
    """The session's warm-started tiny model, the training parquet and a smoke config whose
    ``envace_8b`` and ``per_role_8b`` run on 2 nodes for 3 steps, checkpointing every step."""
    tmp = SHARED / f"session-{os.getpid()}"  # outside /tmp: each node has its own
    shutil.rmtree(SHARED, ignore_errors=True)
    model = tmp / "tiny"
    shutil.copytree(warm_tiny_model, model)
    cfg = load_config(ROOT / "config" / "smoke.yaml")
    cfg["paths"] = {k: str(tmp / k) for k in cfg["paths"]}
    for entry in cfg["models"].values():
        if entry.get("kind") == "tiny":
            entry["path"] = str(model)
    cfg["training"]["judge"]["model"] = str(model)
    cfg["training"]["data"]["source"] = str(ROOT / cfg["training"]["data"]["source"])
    for run in cfg["training"]["runs"].values():
        run["base_model"] = str(model)
        if run.get("simulator"):
            run["simulator"] = str(model)
        run.update(nodes=2, total_steps=3, save_every=1, val_every=100)
    cfg["evaluation"]["checkpoints"]["steps"] = [1, 3]  # within the 3 steps (the config checks it)
    config = tmp / "config.resolved.json"
    config.write_text(json.dumps(cfg, indent=1))
    data = tmp / "data" / "cm2_train.parquet"
    data.parent.mkdir(parents=True)
    p = subprocess.run([str(BIN / "envace"), "data", "--config", str(config), "--out", str(data),
                        "--summary", str(tmp / "summary.json")], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return {"tmp": tmp, "cfg": cfg, "config": config, "data": data}


def _submit(inputs: dict[str, Any], run: str, log: Path, env: dict[str, str] | None = None,
            name: str | None = None) -> str:
    """``sbatch -N 2`` of ``envace train`` for ``run`` into the checkpoint folder ``checkpoints/<name>``
    (default: the run's); its output to ``log``, its exit status to ``<log>.rc``, the job's own output
    (the node list) to ``<log>.slurm``. Returns the job id."""
    tmp, name = inputs["tmp"], name or run
    train = [str(BIN / "envace"), "train", "--config", str(inputs["config"]), "--run", run,
             "--checkpoint-dir", str(tmp / "checkpoints" / name),
             "--done", str(tmp / "results" / "train" / name / "done.json"), "--data", str(inputs["data"])]
    log.parent.mkdir(parents=True, exist_ok=True)
    wrap = (f"echo nodelist=$SLURM_JOB_NODELIST; {' '.join(train)} > {log} 2>&1; "
            f"echo $? > {log}.rc")
    job_env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **(env or {})}
    return _out("sbatch", "--parsable", "-p", PARTITION, "-N", "2", "--ntasks-per-node=1",
                "--cpus-per-task=2", "--mem=6G", "-J", f"two_nodes_{run}", "-o", f"{log}.slurm",
                "--wrap", wrap, timeout=60, env=job_env).strip().split(";")[0]


def _state(job: str) -> str:
    out = _out("squeue", "-h", "-j", job, "-t", "all", "-o", "%T")
    return out.strip() or "GONE"


def _wait(job: str, until: Any = None, timeout: float = JOB_TIMEOUT_S) -> str:
    """Wait until ``job`` ends (or ``until()`` is true); returns its last state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _state(job)
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING") or (until and until()):
            return state
        time.sleep(3)
    subprocess.run(["scancel", job], check=False)
    pytest.fail(f"job {job} still {state} after {timeout:.0f} s")


def _gone_after(job: str) -> None:
    """No Ray or vLLM process of ``job`` left on either node (a few seconds for teardown)."""
    for _ in range(20):
        left = _leftovers()
        if not any(left.values()):
            return
        time.sleep(3)
    pytest.fail(f"processes left after job {job}: {left}")


def _train_cancel_resume(inputs: dict[str, Any], run: str) -> tuple[list[tuple[str, str]], Path, set[str]]:
    """Train ``run`` on both nodes; ``scancel`` it after its first checkpoint; resume it to the end.
    Returns each attempt's (log, job output), the checkpoint folder and the nodes that ran FSDP workers."""
    placement = _Placement()
    tmp = inputs["tmp"]
    ckpt = tmp / "checkpoints" / run
    first = tmp / "attempts" / f"{run}.1.log"
    job = _submit(inputs, run, first)
    latest = ckpt / "latest_checkpointed_iteration.txt"
    state = _wait(job, until=lambda: placement.sample() or (latest.is_file()
                                                             and int(latest.read_text().strip() or 0) >= 1))
    assert state == "RUNNING", f"job {job} ended ({state}) before its first checkpoint:\n" + \
        first.read_text(errors="replace")[-4000:]
    _out("scancel", job)
    _wait(job, timeout=300)
    _gone_after(job)
    last = tmp / "results" / "logs" / "train" / f"{run}.log"  # check_smoke_training reads the last attempt
    job = _submit(inputs, run, last)
    state = _wait(job, until=lambda: placement.sample())
    text = last.read_text(errors="replace")
    assert Path(f"{last}.rc").read_text().strip() == "0", f"job {job} {state}:\n{text[-6000:]}"
    _gone_after(job)
    return [(p.read_text(errors="replace"), Path(f"{p}.slurm").read_text(errors="replace"))
            for p in (first, last)], ckpt, placement.workers


def _checked(inputs: dict[str, Any], run: str, policies: tuple[str, ...]) -> list[dict]:
    tmp = inputs["tmp"]
    spec = inputs["cfg"]["training"]["runs"][run]
    lines = (tmp / "checkpoints" / run / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(x)["data"] for x in lines]
    log = tmp / "results" / "logs" / "train" / f"{run}.log"
    steps = sorted({int(m) for m in check_smoke_training.STEP.findall(log.read_text(errors="replace"))})
    problems = check_smoke_training.check_outputs(tmp / "results", tmp / "checkpoints", run, spec,
                                                  [json.loads(x)["step"] for x in lines], rows, log, steps,
                                                  sum(float(r.get("envace/rows/rehearse", 0)) for r in rows))
    for policy in policies:
        a = check_smoke_training.agreement(rows, policy)
        if a["failed"] or a["missing"]:
            problems.append(f"{run}: {policy} agreement {a}")
    assert problems == []
    return rows


def _both_nodes(log: str, job_output: str) -> None:
    assert "nodelist=envace-n[1-2]" in job_output, job_output
    listed = re.search(r"ray_slurm_launch: Ray nodes: (.*)", log)
    assert listed, log[-3000:]
    for node, address in ADDRESSES.items():
        assert f"{node} ({address}, 1 GPUs)" in listed.group(1)


def test_shared_run_on_two_nodes_cancelled_and_resumed(inputs: dict[str, Any]) -> None:
    attempts, ckpt, workers = _train_cancel_resume(inputs, "envace_8b")
    for log, job_output in attempts:
        _both_nodes(log, job_output)
    assert workers == set(NODES)  # verl's FSDP workers: one per node
    actor = ckpt / "global_step_3" / "actor"
    shards = sorted(p.name for p in actor.glob("model_world_size_*_rank_*.pt"))
    assert shards == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"], shards
    done = json.loads((inputs["tmp"] / "results" / "train" / "envace_8b" / "done.json").read_text())
    assert done["resumed_from"] >= 1
    _checked(inputs, "envace_8b", ("shared",))


def test_per_role_run_puts_each_policy_on_its_own_node(inputs: dict[str, Any]) -> None:
    attempts, _, workers = _train_cancel_resume(inputs, "per_role_8b")
    for log, job_output in attempts:
        _both_nodes(log, job_output)
    assert workers == set(NODES)  # the ACT policy's workers on one node, the REHEARSE policy's on the other
    _checked(inputs, "per_role_8b", ("act", "rehearse"))


def test_a_worker_node_that_cannot_reach_the_head_ends_the_job_naming_it(inputs: dict[str, Any]) -> None:
    """envace-n2 loses its route to envace-n1 (a blackhole route in its namespace; Slurm still reaches
    both through the bridge): the launcher's join wait ends the job with exit 5, naming the node and the
    head's port, and nothing is left running."""
    route = ["ip", "netns", "exec", "envace-n2", "ip", "route"]
    subprocess.run([*route, "add", "blackhole", "10.199.0.1/32"], check=True)
    try:
        log = inputs["tmp"] / "attempts" / "unreachable.log"
        job = _submit(inputs, "envace_8b", log, env={"RAY_JOIN_TIMEOUT": "30"}, name="unreachable")
        _wait(job, timeout=600)
    finally:
        subprocess.run([*route, "del", "blackhole", "10.199.0.1/32"], check=False)
    text = log.read_text(errors="replace")
    assert Path(f"{log}.rc").read_text().strip() != "0"
    assert re.search(r"not joined: envace-n2\. Each node must reach the head at \S+:(\d+) \(GCS port \1\)",
                     text), text[-4000:]
    _gone_after(job)


def test_a_node_whose_ray_dies_mid_run_fails_the_job_and_leaves_nothing(inputs: dict[str, Any]) -> None:
    """After the first checkpoint, envace-n2's raylet is killed (SIGKILL): the job fails (non-zero exit,
    within the job timeout), and no Ray, vLLM or verl process is left on either node."""
    log = inputs["tmp"] / "attempts" / "ray_dies.log"
    latest = inputs["tmp"] / "checkpoints" / "ray_dies" / "latest_checkpointed_iteration.txt"
    job = _submit(inputs, "envace_8b", log, name="ray_dies")
    state = _wait(job, until=lambda: latest.is_file() and int(latest.read_text().strip() or 0) >= 1)
    assert state == "RUNNING", f"job {job} ended ({state}) before its first checkpoint"
    raylets = [pid for pid, cmd in _processes("envace-n2") if "/raylet/raylet" in cmd]
    assert raylets, _processes("envace-n2")
    for pid in raylets:
        os.kill(int(pid), 9)
    _wait(job, timeout=900)
    assert Path(f"{log}.rc").read_text().strip() != "0", log.read_text(errors="replace")[-4000:]
    _gone_after(job)
