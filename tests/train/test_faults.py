"""CI's fault injection into the smoke DAG (benchmarks/faults.py): its check on hand-made outputs of a DAG
that recovered, and of DAGs that did not; how it finds a job's rule log and counts Slurm submissions.
The injection itself runs only against a live Slurm (CI's smoke stage)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("faults", ROOT / "benchmarks" / "faults.py")
faults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(faults)

RUN, SAVED, TOTAL = "per_role_8b", 2, 4


def _line(task: str, sample: int, score: float) -> dict:
    return {"task_id": task, "sample": sample, "score": score}


def _dag(tmp: Path, resumed_from: int = SAVED, retry_steps: tuple[int, ...] = (3, 4),
         final: list[dict] | None = None, extra_retry: str | None = None) -> tuple[Path, Path, Path]:
    """RESULTS, CHECKPOINTS and a config as a recovered DAG leaves them (arguments break one part)."""
    results, ckpt = tmp / "results", tmp / "checkpoints"
    config = tmp / "config.yaml"
    config.write_text(json.dumps({"training": {"runs": {RUN: {"roles": "per_role", "total_steps": TOTAL,
                                                               "save_every": SAVED}}}}))
    done = results / "train" / RUN / "done.json"
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps({"resumed_from": resumed_from, "last_step": TOTAL}))
    log = results / "logs" / "train" / f"{RUN}.log"
    log.parent.mkdir(parents=True)
    resumed = f"/node{ckpt / RUN / f'global_step_{SAVED}'}"  # the trainer logs a longer, absolute path
    log.write_text(f"Resuming from {resumed}\nREHEARSE policy resumed from {resumed}/rehearse_actor\n"
                   + "".join(f"(TaskRunner) step:{n} - a:1\nstep:{n} - a:1\n" for n in retry_steps))
    out = results / "eval" / "qwen3_8b" / "bfcl_v4" / "seed0.jsonl"
    out.parent.mkdir(parents=True)
    kept = [_line("t1", 0, 1.0)]
    final = [*kept, _line("t2", 0, 0.0), _line("t3", 0, 1.0)] if final is None else final
    out.write_text("".join(json.dumps(x) + "\n" for x in final))
    out.with_name("seed0.manifest.json").write_text(json.dumps({"complete": True, "n_samples": len(final)}))
    job_log = results / "logs" / "eval" / "qwen3_8b" / "table1.log"
    job_log.parent.mkdir(parents=True)
    job_log.write_text(f"envace eval: wrote {out} ({len(final) - 1} new samples in 3.0 s, vllm)\n")
    slurm = results / "logs" / "slurm"
    jobs = {"rule_train/per_role_8b": 2, "rule_evaluate_table1/qwen3_8b": 2, "rule_train/envace_8b": 1,
            "rule_figure/fig3": 1}
    if extra_retry:
        jobs[extra_retry] = 2
    for job, n in jobs.items():
        (slurm / job).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (slurm / job / f"{100 + i}.log").write_text("x")
    record = {"training": {"run": RUN, "slurm_job": "17", "saved_step": SAVED},
              "evaluation": {"out": str(out), "job_log": str(job_log), "kept": kept,
                             "first_attempt_log": {"died": True, "resume_hint": True, "error": True}}}
    (results / "faults.json").write_text(json.dumps(record))
    return results, ckpt, config


def _check(results: Path, ckpt: Path, config: Path, capsys) -> tuple[int, str]:
    rc = faults.main(["check", str(results), str(ckpt), str(config)])
    return rc, capsys.readouterr().err


def test_a_recovered_dag_passes(tmp_path, capsys):
    rc, err = _check(*_dag(tmp_path), capsys)
    assert rc == 0, err


def test_a_run_that_restarted_from_scratch_fails(tmp_path, capsys):
    rc, err = _check(*_dag(tmp_path, resumed_from=0, retry_steps=(1, 2, 3, 4)), capsys)
    assert rc == 1
    assert "resumed_from 0" in err and "the retry logged verl steps [1, 2, 3, 4] (want 3..4)" in err, err


def test_an_evaluation_that_lost_or_repeated_samples_fails(tmp_path, capsys):
    changed = [_line("t1", 0, 0.0), _line("t2", 0, 0.0), _line("t2", 0, 0.0)]
    rc, err = _check(*_dag(tmp_path, final=changed), capsys)
    assert rc == 1
    assert "duplicate samples [('t2', 0)]" in err and "missing or changed: [('t1', 0)]" in err, err


def test_prerequisite_samples_written_beside_the_result_count(tmp_path, capsys):
    """BFCL memory: prerequisite conversations finish in the same partial file, then go to their own file."""
    results, ckpt, config = _dag(tmp_path)
    record = json.loads((results / "faults.json").read_text())
    record["evaluation"]["kept"] = [_line("prereq_0", 0, 0.0), _line("t1", 0, 1.0)]
    (results / "faults.json").write_text(json.dumps(record))
    out = Path(record["evaluation"]["out"])
    out.with_name("seed0.prerequisites.jsonl").write_text(json.dumps(_line("prereq_0", 0, 0.0)) + "\n")
    assert _check(results, ckpt, config, capsys) == (0, "")
    job_log = results / "logs" / "eval" / "qwen3_8b" / "table1.log"
    job_log.write_text(f"envace eval: wrote {out} (3 new samples")
    rc, err = _check(results, ckpt, config, capsys)
    assert rc == 1 and "exactly the 2 missing samples" in err, err


def test_a_job_retried_without_a_fault_fails(tmp_path, capsys):
    rc, err = _check(*_dag(tmp_path, extra_retry="rule_figure/fig4"), capsys)
    assert rc == 1 and "a job retried without a fault is a finding" in err, err


def test_no_record_means_no_fault_was_injected(tmp_path, capsys):
    results, ckpt, config = _dag(tmp_path)
    (results / "faults.json").unlink()
    rc, err = _check(results, ckpt, config, capsys)
    assert rc == 1 and "the faults were not injected" in err


@pytest.mark.parametrize(("cmd", "log"), [
    ("bash -c set -euo pipefail;  envace eval --config c.json --out 'r/eval/m/{benchmark}/seed{seed}.jsonl' "
     "> r/logs/eval/m/table1.log 2>&1", "r/logs/eval/m/table1.log"),
    ("envace eval --config c.json --out x.jsonl", None),
])
def test_rule_log_of_a_job_command(cmd, log):
    assert faults.rule_log(cmd) == log


def test_eval_server_finds_the_server_of_the_trained_model_and_its_job_log():
    """On a process table like a Slurm job's: slurmstepd -> snakemake -> bash -c '... > LOG 2>&1' ->
    envace eval -> vllm serve (the model's and the helper's); a training job's server, another checkpoint's
    and a fidelity job's are not it."""
    bash = ("/usr/bin/bash -c set -euo pipefail;  envace eval --config c.json --plan p.json "
            "> results/smoke/logs/eval/all.log 2>&1")
    ckpt = "checkpoints/smoke/envace_8b"
    procs = {
        10: (1, "slurmstepd: [8.0]"),
        11: (10, "python3 -m snakemake --target-jobs evaluate_all:"),
        12: (11, bash),
        13: (12, "python3 .venv/bin/envace eval --config c.json --plan p.json"),
        14: (13, f"python3 .venv/bin/vllm serve {ckpt}/global_step_4/actor/huggingface --port 4000"),
        15: (13, "python3 .venv/bin/vllm serve models/smoke/tiny --port 4003"),
        16: (13, "python3 -c watchdog"),
        20: (1, "slurmstepd: [9.0]"),
        21: (20, "python3 .venv/bin/envace train --run grpo_8b"),
        22: (21, "python3 .venv/bin/vllm serve checkpoints/smoke/grpo_8b/global_step_4 --port 4001"),
        30: (1, "slurmstepd: [10.0]"),
        31: (30, "python3 .venv/bin/envace fidelity --checkpoint-dir checkpoints/smoke/envace_8b"),
        32: (31, f"python3 .venv/bin/vllm serve {ckpt}/global_step_4/actor/huggingface --port 4002"),
        33: (13, f"python3 .venv/bin/vllm serve {ckpt}/global_step_40/actor/huggingface --port 4004"),
    }
    cfg = {"models": {"envace_8b": {"kind": "trained", "run": "envace_8b"}, "qwen3_8b": {"kind": "tiny"},
                      "grpo_8b": {"kind": "trained", "run": "grpo_8b"}},
           "training": {"runs": {"envace_8b": {"total_steps": 4}, "grpo_8b": {"total_steps": 4}}}}
    root = Path("/abs/checkpoints/smoke")
    marker = faults.weights_marker(cfg, root, "envace_8b")
    assert marker == "smoke/envace_8b/global_step_4"
    assert faults.eval_server(marker, procs) == ([14], "results/smoke/logs/eval/all.log")
    assert faults.weights_marker(cfg, root, "envace_8b-step0040") == "smoke/envace_8b/global_step_40"
    assert faults.eval_server("smoke/envace_8b/global_step_40", procs)[0] == [33]
    assert faults.eval_server(faults.weights_marker(cfg, root, "grpo_8b"), procs) == ([], None)
    assert faults.weights_marker(cfg, root, "qwen3_8b") is None


def test_first_attempt_tells_a_failed_job_from_one_that_finished_before_the_kill(tmp_path):
    out = tmp_path / "seed0.jsonl"
    partial = tmp_path / "seed0.jsonl.partial.jsonl"
    log = tmp_path / "job.log"
    ev = {"out": str(out), "job_log": str(log)}
    partial.write_text(json.dumps(_line("t1", 0, 1.0)) + "\n")
    assert faults.first_attempt(ev) == "running"
    log.write_text(f"envace eval: error: model server {faults.DIED}; {faults.RESUME_HINT}\n")
    assert faults.first_attempt(ev) == "failed"
    assert ev["kept"] == [_line("t1", 0, 1.0)] and all(ev["first_attempt_log"].values())
    # the kill came after the last sample: result written, partial removed, no failure reported
    log.write_text("envace eval: wrote seed0.jsonl (1 new samples in 2.0 s)\n")
    partial.unlink()
    out.write_text(json.dumps(_line("t1", 0, 1.0)) + "\n")
    assert faults.first_attempt({"out": str(out), "job_log": str(log)}) == "finished"
