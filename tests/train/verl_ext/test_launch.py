"""Generated command lines, environment, resume check, and the Slurm launcher in dry-run mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envace.common.config import load_config
from envace.train.verl_ext import launch as L

CFG = load_config("config/config.yaml")
ROOT = Path(__file__).resolve().parents[3]


def test_command_line(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    argv = L.build_command(CFG, "envace_8b", "/ck/envace_8b")
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert "--config-name=envace_8b" in argv and "trainer.resume_mode=auto" in argv
    assert "trainer.default_local_dir=/ck/envace_8b" in argv
    assert f"data.train_files={os.path.abspath(CFG['paths']['data'])}/cm2_train.parquet" in argv


def test_runs_in_slurm_go_through_the_launcher(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    argv = L.build_command(CFG, "envace_8b", "/ck")
    sep = argv.index("--")
    assert argv[:2] == ["bash", str(L.SLURM_SCRIPT)]
    assert argv[2:sep] == ["--nodes", "2", "--gpus-per-node", "8", "--python", sys.executable]
    assert argv[sep + 1:sep + 3] == [sys.executable, "-m"]
    one = L.build_command(CFG, "envace_1p7b", "/ck")  # one node: the same launcher
    assert one[:2] == ["bash", str(L.SLURM_SCRIPT)] and one[2:4] == ["--nodes", "1"]
    monkeypatch.delenv("SLURM_JOB_ID")
    assert L.build_command(CFG, "envace_8b", "/ck")[1] == "-m"  # outside Slurm: verl's own local Ray


def test_cpu_run_in_slurm_gives_ray_init_values_to_the_launcher(monkeypatch):
    """Ray refuses num_cpus/num_gpus in ray.init when joining a running cluster: the CPU platform's
    values move from the driver's overrides to the launcher's ``ray start``."""
    smoke = load_config("config/smoke.yaml")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    local = L.build_command(smoke, "per_role_8b", "/ck")
    assert "+ray_kwargs.ray_init.num_gpus=2" in local and "ray_kwargs.ray_init.num_cpus=32" in local
    argv = L.ray_slurm_command(local, smoke["training"]["runs"]["per_role_8b"])
    sep = argv.index("--")
    launcher = ["--nodes", "1", "--gpus-per-node", "2", "--num-cpus", "32", "--python", sys.executable]
    assert argv[2:sep] == launcher
    assert not [a for a in argv if a.startswith(L.RAY_INIT_OVERRIDES)]
    assert argv[sep + 1:] == [a for a in local if not a.startswith(L.RAY_INIT_OVERRIDES)]


@pytest.mark.parametrize(("run", "per_node"), [("envace_8b", 1), ("per_role_8b", 1)])
def test_cpu_run_on_two_nodes(monkeypatch, run, per_node):
    """``nodes: 2`` on the CPU platform: two Slurm nodes of one fake GPU each (the per-role run: one
    policy per node); outside Slurm it is refused with the reason, before anything starts."""
    smoke = load_config("config/smoke.yaml")
    smoke["training"]["runs"][run]["nodes"] = 2
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    argv = L.build_command(smoke, run, "/ck")
    sep = argv.index("--")
    assert argv[2:6] == ["--nodes", "2", "--gpus-per-node", str(per_node)]
    assert "trainer.nnodes=" + ("1" if run == "per_role_8b" else "2") in argv[sep:]
    assert "trainer.n_gpus_per_node=1" in argv[sep:]
    if run == "per_role_8b":
        assert "envace.per_role.rehearse_nnodes=1" in argv[sep:]
    monkeypatch.delenv("SLURM_JOB_ID")
    with pytest.raises(ValueError, match="needs a Slurm allocation"):
        L.build_command(smoke, run, "/ck")


def test_env_adds_external_module():
    env = L.build_env({"VERL_USE_EXTERNAL_MODULES": "other"})
    assert env["VERL_USE_EXTERNAL_MODULES"] == "other,envace.train.verl_ext.register"
    assert L.build_env(env)["VERL_USE_EXTERNAL_MODULES"] == "other,envace.train.verl_ext.register"
    gpu = L.build_env({}, cfg=CFG, run="envace_8b")
    assert "VERL_PLATFORM" not in gpu and gpu["ENVACE_REWARD"] == "checklist"


@pytest.fixture
def no_services(monkeypatch, tmp_path):
    """launch() without starting judge/simulator servers (the paper's: 8B-30B); returns a data file."""
    from contextlib import contextmanager

    @contextmanager
    def none(cfg, run, log_dir):
        yield {}, {}

    monkeypatch.setattr(L, "services", none)
    data = tmp_path / "train.parquet"
    data.write_bytes(b"PAR1")
    return str(data)


def test_services_needed_per_run():
    assert L.service_models(CFG, "envace_8b") == {"judge": CFG["training"]["judge"]["model"]}
    assert L.service_models(CFG, "grpo_8b") == {"simulator": "Qwen/Qwen3-8B",
                                                  "judge": CFG["training"]["judge"]["model"]}


def test_missing_data_exits_4(tmp_path, capsys):
    assert L.launch(CFG, "envace_8b", str(tmp_path / "ck"), str(tmp_path / "d.json"),
                    data=str(tmp_path / "nope.parquet")) == 4
    assert "nope.parquet not found (run `envace data` first)" in capsys.readouterr().err


def test_per_role_launches(tmp_path, monkeypatch, no_services):
    """per_role_8b is no longer refused: the driver runs with the per-role Hydra file and GPU split."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    ck, done = tmp_path / "ck", tmp_path / "done.json"
    calls = []

    def finish(argv, env, *_, **__):
        calls.append((argv, env))
        (ck / "latest_checkpointed_iteration.txt").write_text("470")
        return 0

    monkeypatch.setattr(L, "run_watched", finish)
    assert L.launch(CFG, "per_role_8b", str(ck), str(done), data=no_services) == 0
    (argv, env), = calls
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"] and "--config-name=per_role_8b" in argv
    expected = [
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=8",
        "envace.per_role.rehearse_nnodes=1",
        "envace.per_role.rehearse_n_gpus_per_node=8",
        "envace.roles=per_role",
        "envace.mode=rehearsal",
        f"trainer.default_local_dir={ck}",
        "trainer.resume_mode=auto",
        "trainer.experiment_name=per_role_8b",
    ]
    for item in expected:
        assert item in argv, item
    assert "envace.train.verl_ext.register" in env["VERL_USE_EXTERNAL_MODULES"].split(",")
    assert json.loads(done.read_text())["last_step"] == 470


def test_per_role_multinode_reserves_all_nodes(monkeypatch):
    """Inside Slurm the Ray launcher spans the run's nodes (both policies' pools), not the ACT half."""
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    argv = L.build_command(CFG, "per_role_8b", "/ck")
    i = argv.index("--nodes")
    assert argv[:2] == ["bash", str(L.SLURM_SCRIPT)]
    assert argv[i + 1] == str(CFG["training"]["runs"]["per_role_8b"]["nodes"])


def test_per_role_unsplittable_gpus_exit_2(tmp_path):
    cfg = load_config("config/config.yaml")
    cfg["training"]["runs"]["per_role_8b"]["nodes"] = 3
    assert L.launch(cfg, "per_role_8b", str(tmp_path / "ck"), str(tmp_path / "done.json")) == 1
    assert not (tmp_path / "done.json").exists()


def test_resume_must_advance(tmp_path, monkeypatch, no_services):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "latest_checkpointed_iteration.txt").write_text("50")
    calls = []
    monkeypatch.setattr(L, "run_watched", lambda argv, env, *_, **__: calls.append(argv) or 0)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    done = tmp_path / "done.json"
    assert L.launch(CFG, "envace_8b", str(ck), str(done), data=no_services) == 1
    assert calls and not done.exists()

    def finish(argv, env, *_, **__):
        (ck / "latest_checkpointed_iteration.txt").write_text("470")
        return 0

    monkeypatch.setattr(L, "run_watched", finish)
    assert L.launch(CFG, "envace_8b", str(ck), str(done), data=no_services) == 0
    record = json.loads(done.read_text())
    assert {k: record[k] for k in ("run", "last_step", "resumed_from", "checkpoint_dir", "trainer")} == {
        "run": "envace_8b",
        "last_step": 470,
        "resumed_from": 50,
        "checkpoint_dir": str(ck),
        "trainer": "verl.trainer.main_ppo",
    }
    assert record["versions"]["verl"] == "0.9.1" and record["metrics"] == str(ck / "metrics.jsonl")


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
        "SLURM_JOB_ID": "307",
        "SLURM_CPUS_ON_NODE": "16",
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
    # job 307: ports 22800.. (GCS, client server, dashboard agent, workers), its own Ray folder
    head = next(line for line in out.splitlines() if "ray start --head" in line)
    assert "srun --overlap --nodes=1 --ntasks=1 -w n1 ray start --head --port=22800" in head
    for flag in ("--ray-client-server-port=22801", "--dashboard-agent-listen-port=22802",
                 "--min-worker-port=22810", "--max-worker-port=23199", "--temp-dir=/tmp/ray_j307",
                 "--num-gpus=8", "--num-cpus=16", "--block"):
        assert flag in head, flag
    worker = next(line for line in out.splitlines() if "-w n2 ray start" in line)
    assert "ray start --address=n1:22800 " in worker and "--min-worker-port=22810" in worker
    assert "--ray-client-server-port" not in worker
    # the teardown ends this job's own `ray start` steps; `ray stop` would end every Ray on the node
    assert "+ echo hi" in out and "ray stop" not in out and "+ kill -TERM <ray start steps>" in out
    other = subprocess.run(
        ["bash", script, "--nodes", "2", "--gpus-per-node", "8", "--dry-run", "--", "true"],
        env={**fake_slurm, "SLURM_JOB_ID": "308"}, capture_output=True, text=True, timeout=30)
    assert "--port=23200" in other.stdout and "--temp-dir=/tmp/ray_j308" in other.stdout  # a job beside it
    bad = subprocess.run(
        ["bash", script, "--nodes", "3", "--gpus-per-node", "8", "--dry-run", "--", "true"],
        env=fake_slurm,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 3 and "has 2 nodes" in bad.stderr


def test_metrics_of_attempts_merged_each_step_once(tmp_path):
    """A killed attempt logged steps 1-3 (3 after its last checkpoint, torn last line); the resumed
    attempt re-did 3 and went on: metrics.jsonl holds 1..5 once, step 3 from the second attempt."""
    line = lambda step, v: json.dumps({"step": step, "data": {"v": v}}) + "\n"  # noqa: E731
    (tmp_path / "metrics.attempt0.jsonl").write_text(line(1, "a") + line(2, "a") + line(3, "a") + '{"st')
    (tmp_path / "metrics.attempt1.jsonl").write_text(line(3, "b") + line(4, "b") + line(5, "b"))
    assert L.merge_metrics(tmp_path) == [1, 2, 3, 4, 5]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["data"]["v"] for r in rows] == ["a", "a", "b", "b", "b"]
    assert L._next_metrics_file(tmp_path).name == "metrics.attempt2.jsonl"


def test_judge_failures_counted_once_per_trajectory_and_stop_the_run():
    """Rows as verl stores them: reward_extra_info copied to every row of a trajectory; counted on
    envace_row 0; padding ignored. A dead judge (every verdict failed) stops the step."""
    from envace.train.verl_ext.trainer import JudgeFailureError, check_judge_failures, judge_failure_stats

    ok = {"judge_failures": 0, "judge_verdicts": 4, "dropped": False}
    dead = {"judge_failures": 3, "judge_verdicts": 3, "dropped": False}
    extra = [
        {"envace_row": 0, "reward_extra_info": dead}, {"envace_row": 1, "reward_extra_info": dead},
        {"envace_row": 0, "reward_extra_info": ok}, {"envace_row": 1, "reward_extra_info": ok},
        {"envace_row": 0, "reward_extra_info": dead},
    ]
    tags = [{}, {}, {}, {}, {"is_padding": True}]
    stats = judge_failure_stats(extra, tags)
    assert stats["envace/judge/failures"] == 3 and stats["envace/judge/failed_trajectories"] == 1
    assert stats["envace/judge/failed_share"] == 0.5 and stats["envace/judge/verdicts"] == 7
    check_judge_failures(stats, 0.5, step=1)  # at the limit: goes on
    with pytest.raises(JudgeFailureError, match=r"step 2: 50% .* envace\.max_judge_failure_share=0\.25"):
        check_judge_failures(stats, 0.25, step=2)
    assert judge_failure_stats([{"envace_row": 0, "reward_extra_info": {"score": 1.0}}], None)[
        "envace/judge/failed_share"] == 0.0  # reference-match reward: no judge, nothing failed


def test_terminations_are_shares_of_the_steps_trajectories():
    """Counted on each trajectory's first row (envace_row 0); padding and rows without a reason ignored."""
    from envace.train.verl_ext.trainer import termination_stats

    extra = [
        {"envace_row": 0, "envace_termination": "final_answer"},
        {"envace_row": 1, "envace_termination": "final_answer"},
        {"envace_row": 0, "envace_termination": "rehearsal_malformed"},
        {"envace_row": 0, "envace_termination": "final_answer"},
        {"envace_row": 0, "envace_termination": "max_turns"},
        {"envace_row": 0, "envace_termination": "final_answer"},
        {"envace_row": 0},
    ]
    tags = [{}, {}, {}, {}, {}, {"is_padding": True}, {}]
    assert termination_stats(extra, tags) == {"envace/termination/final_answer": 0.5,
                                              "envace/termination/max_turns": 0.25,
                                              "envace/termination/rehearsal_malformed": 0.25}
    assert termination_stats([], None) == {}


def test_done_file_lists_judge_failures_per_step(tmp_path):
    key = "envace/judge/failures"
    rows = [{"step": 1, "data": {key: 0.0}}, {"step": 2, "data": {key: 4.0}}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert L.judge_failures_per_step(tmp_path) == {"1": 0.0, "2": 4.0}


def test_done_file_lists_rehearse_metrics_per_step(tmp_path):
    """The REHEARSE-vs-reference metrics per step; a metric no step logged is left out."""
    exact, malformed = "envace/rehearse/reference_exact", "envace/rehearse/malformed_share"
    rows = [{"step": 1, "data": {exact: 0.25, malformed: 0.1}}, {"step": 2, "data": {exact: 0.5}}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert L.rehearse_per_step(tmp_path) == {"reference_exact": {"1": 0.25, "2": 0.5},
                                             "malformed_share": {"1": 0.1}}
    assert L.rehearse_per_step(tmp_path / "none") == {}
