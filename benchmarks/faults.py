"""Faults injected into the smoke DAG while it runs through Slurm, and the check that it recovered.

The smoke run is the integration test: CI runs the whole smoke DAG through a real Slurm
(``profiles/slurm-localhost``, ``retries: 1`` as on the cluster) with this script's ``inject`` beside it,
then ``check`` on its outputs.

``inject RESULTS CHECKPOINTS CONFIG...`` breaks two running jobs of that DAG, once each, and writes what it
did to ``RESULTS/faults.json`` (temp file, then rename):

1. training: once the per-role run (the run with ``roles: per_role``; two policies, so its resume covers
   verl's and ours) has a checkpoint of step >= ``save_every`` and short of ``total_steps``, ``scancel`` its
   Slurm job (found by squeue's comment ``rule_train_wildcards_<run>``);
2. evaluation: once a trained model's evaluation has a partial file (``<out>.partial.jsonl``) with a
   finished sample, SIGKILL the ``vllm serve`` of that model's weights (a descendant of an ``envace eval``
   inside a ``slurmstepd``; the smoke DAG's one evaluation job or a per-model job alike) and wait for the
   job's log to report the dead server (then keep a copy of the finished lines). A kill that lands after
   the last sample (the result written, no failure) tested nothing: it is listed under
   ``missed_evaluations`` and another evaluation is killed.

Snakemake's retry resubmits both jobs. ``check RESULTS CHECKPOINTS CONFIG...`` then asserts, exit 1 with
the reasons otherwise: the cancelled run resumed from the step it had saved (its done-file, verl's
``Resuming from .../global_step_N`` and our ``REHEARSE policy resumed from .../global_step_N/rehearse_actor``
in the retry's log, verl's step lines of the retry exactly N+1..total_steps); the killed evaluation's
first attempt said so (server died, exit -9, "rerun the same command to resume"), its final file holds
every sample once, the lines finished before the kill unchanged, the retry ran only the missing ones,
and the manifest says complete; the two faulted jobs were submitted twice and every other job once (a
job that needed a retry without a fault is a finding, not noise). What every run must show anyway
(each step logged once, both policies' agreement, checkpoints) is ``benchmarks/check_smoke_training.py``'s.

Usage (``.ci/run``)::

    CONFIGS="config/smoke.yaml config/smoke_ledger.yaml"   # make smoke's
    python benchmarks/faults.py inject results/smoke checkpoints/smoke $CONFIGS &
    make smoke-slurm
    python benchmarks/faults.py check results/smoke checkpoints/smoke $CONFIGS
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from envace.common.atomic import atomic_write_json
from envace.common.config import merge_config_files
from envace.train.verl_ext.launch import last_step

POLL_S = 0.2
DIED = "died (its process exited with code -9)"
RESUME_HINT = "rerun the same command to resume"
FIRST_ATTEMPT_S = 120  # how long a killed evaluation may take to fail


def per_role_run(cfg: dict[str, Any]) -> str:
    runs = [r for r, spec in cfg["training"]["runs"].items() if spec.get("roles") == "per_role"]
    if not runs:
        raise SystemExit("faults: the config has no per-role run (training.runs.*.roles: per_role)")
    return runs[0]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Complete lines only (a line still being written has no newline yet)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n")[:-1] if line]


def processes() -> dict[int, tuple[int, str]]:
    """``pid -> (parent pid, command line)`` of every live process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if cmd:
            out[int(entry.name)] = (ppid, cmd)
    return out


def ancestors(pid: int, procs: dict[int, tuple[int, str]]) -> list[str]:
    """Command lines of ``pid``'s ancestors, nearest first."""
    chain = []
    while pid in procs and len(chain) < 64:
        pid = procs[pid][0]
        chain.append(procs.get(pid, (0, ""))[1])
    return chain


def weights_marker(cfg: dict[str, Any], checkpoints: Path, model: str) -> str | None:
    """What the ``vllm serve`` command line of a trained model (or one of its checkpoints) holds: its
    checkpoint's folder, ``<checkpoints name>/<run>/global_step_<N>`` (relative or absolute alike; N the
    checkpoint's step, or the run's last for the final model); None for a model served from a plain folder
    (the tiny model: also the helpers' path)."""
    run, sep, step = model.rpartition("-step")
    if sep and step.isdigit():
        n = int(step)
    else:
        entry = cfg["models"].get(model, {})
        if entry.get("kind") != "trained":
            return None
        run, n = entry["run"], int(cfg["training"]["runs"][entry["run"]]["total_steps"])
    return f"{checkpoints.name}/{run}/global_step_{n}"


def eval_server(marker: str, procs: dict[int, tuple[int, str]] | None = None) -> tuple[list[int], str | None]:
    """Pids of the ``vllm serve`` processes whose command line holds ``marker`` (:func:`weights_marker`)
    and that descend from an ``envace eval`` inside a Slurm job, and that job's rule log (the ``> LOG`` of
    its shell command). ``procs``: :func:`processes` (default: now)."""
    procs = processes() if procs is None else procs
    found: list[int] = []
    log = None
    for pid, (_, cmd) in procs.items():
        argv = cmd.split()
        if len(argv) < 3 or "serve" not in argv[1:3] or not any(a.endswith("vllm") for a in argv[:2]):
            continue
        if not re.search(re.escape(marker) + r"(/|\s|$)", cmd):
            continue
        chain = ancestors(pid, procs)
        job = [c for c in chain if " eval " in c]
        if job and any("slurmstepd" in c for c in chain):
            found.append(pid)
            log = next((path for c in job if (path := rule_log(c))), log)
    return found, log


def rule_log(cmd: str) -> str | None:
    """The rule log a job's shell command writes to (``... > LOG 2>&1``), or None."""
    m = re.search(r">\s*'?([^\s']+\.log)'?\s+2>&1", cmd)
    return m.group(1) if m else None


def slurm_job(run: str) -> str | None:
    """The running Slurm job of rule ``train`` for ``run`` (squeue's comment, set by Snakemake's executor)."""
    res = subprocess.run(["squeue", "-h", "-o", "%i|%k|%T"], capture_output=True, text=True, timeout=30)
    for line in res.stdout.splitlines():
        job, comment, state = (line.split("|") + ["", "", ""])[:3]
        if comment.strip() == f"rule_train_wildcards_{run}" and state == "RUNNING":
            return job.strip()
    return None


def cancel_training(ckpt: Path, run: str, spec: dict[str, Any]) -> dict[str, Any] | None:
    """``scancel`` the run's job once it saved a checkpoint short of its last step; None until then."""
    saved = last_step(ckpt)
    if not int(spec["save_every"]) <= saved < int(spec["total_steps"]):
        return None
    job = slurm_job(run)
    if job is None:
        return None
    subprocess.run(["scancel", job], check=True, timeout=30)
    print(f"faults: scancel {job} (train {run}) after its checkpoint of step {saved}", flush=True)
    return {"run": run, "slurm_job": job, "saved_step": saved, "at": time.time()}


def kill_evaluation(results: Path, checkpoints: Path, cfg: dict[str, Any],
                    skip: set[str]) -> dict[str, Any] | None:
    """SIGKILL the model server of a trained model's evaluation (not in ``skip``) whose partial file holds
    a finished sample (a trained model's server serves that model only: the tiny model's also serves the
    user simulators)."""
    for partial in sorted((results / "eval").glob("*/*/seed*.jsonl.partial.jsonl")):
        out = partial.with_name(partial.name.removesuffix(".partial.jsonl"))
        marker = weights_marker(cfg, checkpoints, out.parent.parent.name)
        if marker is None or str(out) in skip or not read_jsonl(partial):
            continue
        servers, log = eval_server(marker)
        if len(servers) != 1 or log is None:
            continue
        os.kill(servers[0], signal.SIGKILL)
        print(f"faults: SIGKILL {servers[0]} (vllm serve of the evaluation writing {out})", flush=True)
        return {"out": str(out), "server_pid": servers[0], "job_log": log, "at": time.time()}
    return None


def first_attempt(ev: dict[str, Any]) -> str:
    """Where the killed evaluation's first attempt stands: ``"failed"`` (its log reports the dead server
    and the resume hint: ``ev`` gets ``first_attempt_log`` and ``kept``, the partial file's final lines,
    read before the retry truncates the log), ``"finished"`` (its result was written: the kill came after
    the last sample, so it tested nothing) or ``"running"``."""
    out = Path(ev["out"])
    log = Path(ev["job_log"])
    text = log.read_text(errors="replace") if log.is_file() else ""
    if RESUME_HINT in text:
        ev["first_attempt_log"] = {"died": DIED in text, "resume_hint": True,
                                   "error": "envace eval: error: model server" in text}
        ev["kept"] = read_jsonl(Path(ev["out"] + ".partial.jsonl"))
        return "failed"
    if out.is_file() and not Path(ev["out"] + ".partial.jsonl").exists():
        return "finished"
    return "running"


def inject(args: argparse.Namespace) -> int:
    cfg = merge_config_files(args.configs)
    run = per_role_run(cfg)
    spec, ckpt = cfg["training"]["runs"][run], args.checkpoints / run
    record: dict[str, Any] = {"training": None, "evaluation": None, "missed_evaluations": []}
    pending: dict[str, Any] | None = None  # a killed evaluation whose first attempt has not ended yet
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and not (record["training"] and record["evaluation"]):
        if record["training"] is None:
            record["training"] = cancel_training(ckpt, run, spec)
        if record["evaluation"] is None and pending is None:
            pending = kill_evaluation(args.results, args.checkpoints, cfg, set(record["missed_evaluations"]))
            if pending:
                pending["until"] = time.monotonic() + FIRST_ATTEMPT_S
        if pending:
            state = first_attempt(pending)
            if state == "failed" or time.monotonic() > pending["until"]:  # a timeout: check says why
                record["evaluation"], pending = pending, None
                record["evaluation"].pop("until")
                print(f"faults: {record['evaluation']['out']}: first attempt {state} with "
                      f"{len(record['evaluation'].get('kept', []))} finished samples", flush=True)
            elif state == "finished":
                print(f"faults: {pending['out']} finished before its server died; killing another",
                      flush=True)
                record["missed_evaluations"].append(pending["out"])
                pending = None
        time.sleep(POLL_S)
    atomic_write_json(args.results / "faults.json", record, indent=1)
    missing = [k for k in ("training", "evaluation") if not record[k]]
    if missing:
        print(f"faults: not injected within {args.timeout:.0f} s: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


def slurm_attempts(logdir: Path) -> Counter[str]:
    """Submissions per job (``<rule>/<wildcards>``): sbatch logs in the executor's log folder."""
    return Counter(str(p.parent.relative_to(logdir)) for p in logdir.rglob("*.log"))


def check_training(record: dict[str, Any], results: Path, checkpoints: Path,
                   cfg: dict[str, Any]) -> list[str]:
    run, saved = record["run"], int(record["saved_step"])
    total = int(cfg["training"]["runs"][run]["total_steps"])
    done_file = results / "train" / run / "done.json"
    done = json.loads(done_file.read_text()) if done_file.is_file() else {}
    problems = []
    if done.get("resumed_from") != saved or done.get("last_step") != total:
        problems.append(f"{run}: done-file says resumed_from {done.get('resumed_from')}, last_step "
                        f"{done.get('last_step')} (cancelled after step {saved}: want {saved} and {total})")
    log = (results / "logs" / "train" / f"{run}.log").read_text(errors="replace")  # the retry's
    if not re.search(rf"Resuming from \S*global_step_{saved}\b", log):
        problems.append(f"{run}: the retry's log has no verl 'Resuming from ...global_step_{saved}'")
    resumed = checkpoints / run / f"global_step_{saved}" / "rehearse_actor"  # the log names it absolute
    if not re.search(rf"REHEARSE policy resumed from \S*{re.escape(str(resumed))}\b", log):
        problems.append(f"{run}: the retry's log has no 'REHEARSE policy resumed from .../{resumed}'")
    lines = [int(m) for m in re.findall(r"step:(\d+) - ", log)]
    # consecutive copies of one step line are one step (under Slurm the job log repeated each once)
    steps = [n for i, n in enumerate(lines) if i == 0 or lines[i - 1] != n]
    if steps != list(range(saved + 1, total + 1)):
        problems.append(f"{run}: the retry logged verl steps {steps} (want {saved + 1}..{total})")
    return problems


def check_evaluation(record: dict[str, Any]) -> list[str]:
    out = Path(record["out"])
    kept = record.get("kept", [])
    main = read_jsonl(out)
    # BFCL memory's prerequisite conversations share the run's partial file; the finished run writes them
    # beside its result file (<out stem>.prerequisites.jsonl)
    final = main + read_jsonl(out.with_name(out.name.removesuffix(".jsonl") + ".prerequisites.jsonl"))
    keys = [(line["task_id"], line["sample"]) for line in final]
    problems = []
    first = record.get("first_attempt_log") or {}
    if not (first.get("died") and first.get("resume_hint") and first.get("error")):
        problems.append(f"{out}: the first attempt's log did not report the dead server ({first})")
    if len(keys) != len(set(keys)):
        problems.append(f"{out}: duplicate samples {[k for k, n in Counter(keys).items() if n > 1]}")
    by_key = dict(zip(keys, final, strict=True))
    changed = [(x["task_id"], x["sample"]) for x in kept if by_key.get((x["task_id"], x["sample"])) != x]
    if changed:
        problems.append(f"{out}: samples finished before the kill are missing or changed: {changed}")
    if not len(kept) < len(final):
        problems.append(f"{out}: {len(kept)} of {len(final)} samples finished before the kill: nothing "
                        "resumed")
    manifest_file = out.with_name(out.name.removesuffix(".jsonl") + ".manifest.json")
    manifest = json.loads(manifest_file.read_text()) if manifest_file.is_file() else {}
    if manifest.get("complete") is not True or manifest.get("n_samples") != len(main):
        problems.append(f"{manifest_file}: complete {manifest.get('complete')}, n_samples "
                        f"{manifest.get('n_samples')} (want true and {len(main)})")
    log, new = Path(record["job_log"]), len(final) - len(kept)
    if not log.is_file() or f"wrote {out} ({new} new samples" not in log.read_text(errors="replace"):
        problems.append(f"{log}: the retry did not write {out} with exactly the {new} missing samples")
    return problems


def check(args: argparse.Namespace) -> int:
    cfg = merge_config_files(args.configs)
    path = args.results / "faults.json"
    if not path.is_file():
        print(f"FAIL: no {path}: the faults were not injected", file=sys.stderr)
        return 1
    record = json.loads(path.read_text())
    problems = [f"{k}: not injected" for k in ("training", "evaluation") if not record.get(k)]
    if record.get("training"):
        problems += check_training(record["training"], args.results, args.checkpoints, cfg)
    if record.get("evaluation"):
        problems += check_evaluation(record["evaluation"])
    attempts = slurm_attempts(args.results / "logs" / "slurm")
    retried = {job: n for job, n in attempts.items() if n > 1}
    print(f"faults: {sum(attempts.values())} Slurm submissions of {len(attempts)} jobs; retried: {retried}")
    if record.get("training") and attempts.get(f"rule_train/{record['training']['run']}") != 2:
        problems.append(f"the cancelled training job was submitted "
                        f"{attempts.get('rule_train/' + record['training']['run'])} times (want 2)")
    if len(retried) != 2 or len([j for j in retried if j.startswith("rule_evaluate")]) != 1:
        problems.append(f"jobs submitted more than once: {retried} (want the cancelled training and the "
                        "killed evaluation's job, twice each; a job retried without a fault is a finding)")
    for p in problems:
        print("FAIL:", p, file=sys.stderr)
    if not problems:
        t, e = record["training"], record["evaluation"]
        print(f"faults: {t['run']} cancelled after step {t['saved_step']} and resumed from it; "
              f"{e['out']}: server killed after {len(e['kept'])} samples, the rest finished on the retry")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["inject", "check"])
    ap.add_argument("results", type=Path)
    ap.add_argument("checkpoints", type=Path)
    ap.add_argument("configs", type=Path, nargs="+", help="config files, merged in order as --configfile")
    ap.add_argument("--timeout", type=float, default=3600, help="inject: give up after this many seconds")
    args = ap.parse_args(argv)
    return inject(args) if args.command == "inject" else check(args)


if __name__ == "__main__":
    sys.exit(main())
