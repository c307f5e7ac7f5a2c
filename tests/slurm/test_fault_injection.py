"""Fault injection through a real one-node Slurm: a cancelled training job and a killed model server.

Both tests run Snakemake on small targets of the smoke DAG in a sandbox (see ``conftest.py``), break the
running job from outside, check that Snakemake fails, re-run the same target and check what the
re-run kept and redid:

1. ``test_training_cancelled_then_resumed``: the per-role run ``per_role_8b`` (verl's ``main_ppo`` on
   the CPU platform, two policies) with more steps; ``scancel`` its job once a checkpoint of step >=
   ``save_every`` exists; the re-run resumes from verl's last checkpoint (done-file, verl's step lines: no
   step repeated or skipped), ends at ``total_steps`` and leaves ``metrics.jsonl`` with every step
   exactly once; the REHEARSE policy resumes from the same step (its log line, ``rehearse_actor/`` in the
   last step folder), and every step of both attempts logged both policies' rollout-vs-actor agreement
   (``envace/rollout_actor_corr/{act,rehearse}``) and both updates (``actor/pg_loss``,
   ``rehearse_actor/pg_loss``). Why the per-role run and not ``envace_8b``: its resume is verl's (the ACT
   policy, through the shared-policy trainer it extends) plus the REHEARSE policy's, so it covers both
   (``envace_8b`` ran here before, one 13-minute test is what CI's time allows).
2. ``test_evaluation_server_killed_then_resumed``: one evaluation job (tiny model, BFCL multi-turn, all
   seeds; seed 0 runs first); SIGKILL its ``vllm serve`` process (found among the job's descendants) once
   the partial file of seed 0
   holds a sample; the job log names the dead server and its exit code; the re-run evaluates only the
   missing samples and the final file holds every expected (task, sample) exactly once, with the
   pre-kill lines unchanged.

They skip unless a Slurm controller answers (``scripts/slurm_localhost.sh start``). Measured on 2 cores:
11 min for both in CI (4 training steps, the warm-started model from ``tests/conftest.py``'s cache);
with 8 steps, run alone, the training test took ~13 min, of which the per-role run's start-up ~4 min
per attempt and ~2 min Snakemake's slurm executor noticing the cancelled job (it polls ``squeue`` at
intervals growing by 10 s, and after a failed job exits only when the next interval has passed).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from envace.train.verl_ext.launch import last_step as latest_step

from .conftest import SlurmWorkflow, ancestors, processes, tail, wait_for

RUN = "per_role_8b"
MIN_AGREEMENT = 0.99  # what every synced run measures on CPU (~0.997 at smoke scale)
TOTAL_STEPS = 4  # the per-role run on 2 cores: ~4 min start-up, then ~12 s a step: time to cancel after 2
SAVE_EVERY = 2
MODEL, BENCHMARK, SEED = "qwen3_8b", "bfcl_multi_turn", 0
LIMIT = 6  # tasks per split (2 splits); 0.5-4 s a sample on 2 cores

START_TIMEOUT = 600  # submit, start (verl: ~2 min; a vLLM server: ~1-1.5 min), first checkpoint / sample
FAIL_TIMEOUT = 180  # Snakemake notices the broken job (squeue polling backs off to tens of seconds)
RERUN_TIMEOUT = 600


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Complete lines only (a line still being written has no newline yet)."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.split("\n")[:-1] if line]


def _alive_or_fail(proc: subprocess.Popen[bytes], wf: SlurmWorkflow, *logs: Path) -> None:
    if proc.poll() is not None:
        pytest.fail(f"snakemake exited (code {proc.returncode}) before the fault was injected\n"
                    f"{wf.diagnose(*logs)}")


def test_training_cancelled_then_resumed(workflow: SlurmWorkflow) -> None:
    wf = workflow
    assert wf.config()["training"]["runs"][RUN].get("roles") == "per_role"
    wf.configure({"training": {"runs": {RUN: {"total_steps": TOTAL_STEPS, "save_every": SAVE_EVERY,
                                              "val_every": TOTAL_STEPS}}}})
    results, ckpt = wf.path("results"), wf.path("checkpoints") / RUN
    done_file = results / "train" / RUN / "done.json"
    train_log = results / "logs" / "train" / f"{RUN}.log"
    metrics = ckpt / "metrics.jsonl"
    first_attempt = ckpt / "metrics.attempt0.jsonl"  # verl's file logger, this attempt (launch.py)

    proc, log = wf.start(str(done_file))

    def checkpointed() -> int:
        _alive_or_fail(proc, wf, log, train_log)
        return latest_step(ckpt) if latest_step(ckpt) >= SAVE_EVERY else 0

    first = wait_for(checkpointed, START_TIMEOUT, f"a checkpoint of step >= {SAVE_EVERY} in {ckpt}",
                     lambda: wf.diagnose(log, train_log), interval=0.2)
    running = [j for j in wf.jobs() if j["state"] == "RUNNING" and j["comment"].startswith("rule_train")]
    assert len(running) == 1, f"expected one running train job, squeue shows {wf.jobs()}"
    subprocess.run(["scancel", running[0]["id"]], check=True, timeout=30)

    rc = wf.wait(proc, log, FAIL_TIMEOUT, "after scancel")
    assert rc != 0, f"snakemake exited 0 although its train job was cancelled\n{wf.diagnose(log)}"
    state = {j["id"]: j["state"] for j in wf.jobs()}.get(running[0]["id"])
    assert state == "CANCELLED", f"slurm job {running[0]['id']} is {state}, not CANCELLED"
    job_logs = list(wf.slurm_logdir.rglob(f"{running[0]['id']}.log"))
    assert len(job_logs) == 1 and f"JOB {running[0]['id']} ON" in job_logs[0].read_text(), wf.diagnose(log)
    assert "CANCELLED AT" in job_logs[0].read_text(), tail(job_logs[0])
    assert not done_file.exists(), "a cancelled run wrote its done-file"
    saved = latest_step(ckpt)
    assert first <= saved < TOTAL_STEPS, (
        f"the job reached step {saved} of {TOTAL_STEPS} before it was cancelled: nothing left to resume")
    steps_before = [m["step"] for m in _read_jsonl(first_attempt)]
    assert steps_before[:saved] == list(range(1, saved + 1)), f"metrics before the re-run: {steps_before}"

    rc, log2 = wf.run(str(done_file), RERUN_TIMEOUT, "re-run after scancel")
    assert rc == 0, f"the re-run failed\n{wf.diagnose(log2, train_log)}"

    done = json.loads(done_file.read_text())
    assert done["resumed_from"] == saved and done["last_step"] == TOTAL_STEPS, done
    text = train_log.read_text(errors="replace")  # the re-run's log (the rule's shell truncates it)
    lines = [int(m) for m in re.findall(r"step:(\d+) - ", text)]
    # verl's own step lines, in order; in the job log under Slurm each appeared twice in a row (seen in
    # CI, cause not established), so consecutive copies are one step: no step re-done after a later
    # one, none skipped
    logged_steps = [n for i, n in enumerate(lines) if i == 0 or lines[i - 1] != n]
    assert logged_steps == list(range(saved + 1, TOTAL_STEPS + 1)), lines

    assert latest_step(ckpt) == TOTAL_STEPS
    assert (ckpt / f"global_step_{TOTAL_STEPS}" / "actor" / "huggingface" / "config.json").is_file()
    merged = _read_jsonl(metrics)
    steps_after = [m["step"] for m in merged]
    assert steps_after == list(range(1, TOTAL_STEPS + 1)), (
        f"metrics.jsonl must hold each step once, in order; has {steps_after}")
    last = ckpt / f"global_step_{TOTAL_STEPS}"
    assert (last / "rehearse_actor").is_dir(), sorted(p.name for p in last.iterdir())
    assert re.search(rf"Resuming from \S*global_step_{saved}\b", text), tail(train_log)  # verl's (ACT)
    resumed = ckpt / f"global_step_{saved}" / "rehearse_actor"
    assert f"REHEARSE policy resumed from {resumed}" in text, tail(train_log)
    for m in merged:
        for policy in ("act", "rehearse"):
            corr = m["data"].get(f"envace/rollout_actor_corr/{policy}")
            assert corr is not None and float(corr) >= MIN_AGREEMENT, (m["step"], policy, corr)
        updates = {"actor/pg_loss", "rehearse_actor/pg_loss"}
        assert updates <= set(m["data"]), (m["step"], sorted(m["data"]))


def _expected_samples(wf: SlurmWorkflow, work_dir: Path) -> list[tuple[str, int]]:
    """Every (task, sample) of the evaluation, from the benchmark adapter and the merged config."""
    from envace.bench import get_adapter

    bcfg = wf.config()["benchmarks"][BENCHMARK]
    adapter = get_adapter(BENCHMARK, config=dict(bcfg), work_dir=work_dir)
    tasks = adapter.load_tasks(list(bcfg["splits"]), bcfg.get("limit"))
    return [(t.task_id, s) for t in tasks for s in range(int(bcfg.get("samples", 1)))]


def _server_of(out: Path) -> list[int]:
    """Pids of ``vllm serve`` processes started by the ``envace eval`` that writes ``out``, inside
    a Slurm job (a ``slurmstepd`` among their ancestors)."""
    procs = processes()
    found = []
    for pid, line in procs.items():
        argv = line.split()
        if len(argv) < 3 or "serve" not in argv[1:3] or not any(a.endswith("vllm") for a in argv[:2]):
            continue
        chain = [procs.get(a, "") for a in ancestors(pid)]
        if any("eval" in c and str(out.parent) in c for c in chain) and any("slurmstepd" in c for c in chain):
            found.append(pid)
    return found


def test_evaluation_server_killed_then_resumed(workflow: SlurmWorkflow, tmp_path: Path) -> None:
    wf = workflow
    wf.configure({"benchmarks": {BENCHMARK: {"limit": LIMIT}}})
    results = wf.path("results")
    out = results / "eval" / MODEL / BENCHMARK / f"seed{SEED}.jsonl"
    partial = out.with_name(out.name + ".partial.jsonl")
    job_log = results / "logs" / "eval" / MODEL / f"{BENCHMARK}.log"
    expected = _expected_samples(wf, tmp_path / "adapter_work")
    assert len(expected) >= 2, expected

    proc, log = wf.start(str(out))

    def one_sample() -> bool:
        _alive_or_fail(proc, wf, log, job_log)
        return len(_read_jsonl(partial)) >= 1

    wait_for(one_sample, START_TIMEOUT, f"a finished sample in {partial}", lambda: wf.diagnose(log, job_log),
             interval=0.2)
    servers = _server_of(out)
    assert len(servers) == 1, f"expected one model server of the eval job, found {servers}\n{wf.diagnose()}"
    os.kill(servers[0], signal.SIGKILL)

    rc = wf.wait(proc, log, FAIL_TIMEOUT, "after killing the model server")
    assert rc != 0, f"snakemake exited 0 although the model server was killed\n{wf.diagnose(log)}"
    first_log = job_log.read_text(errors="replace")
    assert "envace eval: error: model server" in first_log, tail(job_log)
    assert "vllm server of" in first_log, tail(job_log)
    assert "died (its process exited with code -9)" in first_log, tail(job_log)
    assert "rerun the same command to resume" in first_log, tail(job_log)
    assert not out.exists(), "a failed evaluation left its result file"
    kept = _read_jsonl(partial)
    assert 1 <= len(kept) < len(expected), (
        f"{len(kept)} of {len(expected)} samples finished before the kill: nothing left to resume")

    rc, log2 = wf.run(str(out), RERUN_TIMEOUT, "re-run after the server was killed")
    assert rc == 0, f"the re-run failed\n{wf.diagnose(log2, job_log)}"

    final = _read_jsonl(out)
    keys = [(line["task_id"], line["sample"]) for line in final]
    assert len(keys) == len(set(keys)), f"duplicate samples in {out}: {keys}"
    assert sorted(keys) == sorted(expected), f"samples {keys} != expected {expected}"
    by_key = dict(zip(keys, final, strict=True))
    for line in kept:
        key = (line["task_id"], line["sample"])
        assert by_key[key] == line, f"sample {key} written before the kill changed in the re-run"
    manifest = json.loads(out.with_name(f"seed{SEED}.manifest.json").read_text())
    assert manifest["n_samples"] == len(expected) and manifest["complete"] is True, manifest
    assert f"({len(expected) - len(kept)} new samples" in job_log.read_text(errors="replace"), tail(job_log)
    assert not partial.exists(), "the partial file outlived the finished evaluation"
