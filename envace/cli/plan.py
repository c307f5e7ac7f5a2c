"""``envace plan``: the cost of each training run before anything is submitted.

For every run in ``training.runs`` (or ``--run``), an upper bound from the configured budgets:

- tokens per step = prompts_per_step x rollouts_per_prompt x (max_prompt_tokens + max_response_tokens);
- FLOPs per step = 6 x N x tokens (forward + backward of the update) + 2 x N x tokens (generation),
  N = parameter count from the run's model ``size`` (the ``models`` entry whose ``run`` is this run, else
  a ``<number>B`` in ``base_model``);
- GPU-hours = total_steps x FLOPs per step / (peak FLOP/s x MFU) / 3600, and wall hours = GPU-hours /
  (nodes x gpus_per_node).

Assumptions (stated in the output): peak 148 TFLOP/s per GPU (NVIDIA H20, BF16 dense; the paper's
GPUs) and 30 % MFU, both overridable. Not counted: the old-log-prob and reference forward passes, the
judge / external simulator servers, validation, and that real episodes are usually shorter than the
budgets (the tokens are an upper bound).

``--target T`` (e.g. ``released``, ``all``, a file) adds what the cluster is asked for: Snakemake's own
plan of ``T`` with the Slurm profile (``snakemake -n T --profile slurm``), per rule its jobs, each job's
GPUs (``gpu``, or ``nodes`` x the ``gres`` count) and time limit (``runtime``), and their product summed
as reserved GPU-hours: an upper bound set by the profile's time limits, not a measurement. Local rules
(the report steps) reserve nothing.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from envace.common.config import DEFAULT_CONFIG, load_config

_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?|\d+p\d+)\s*[bB]\b")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="tokens per step and GPU-hours of each training run")
    p.add_argument("--config", default=DEFAULT_CONFIG,
                   help="experiment config (models and training.runs) (default: %(default)s)")
    p.add_argument("--run", action="append", help="only these runs (repeatable; default: all)")
    p.add_argument("--peak-tflops", type=float, default=148.0, help="peak TFLOP/s per GPU (H20 BF16)")
    p.add_argument("--mfu", type=float, default=0.3, help="model FLOPs utilisation assumed")
    p.add_argument("--target", action="append",
                   help="also the Slurm reservation of a Snakemake target's jobs (repeatable; e.g. released)")
    p.set_defaults(func=run)


def parse_size(text: str) -> float | None:
    """Parameters from ``"8B"``, ``"1.7B"``, ``"Qwen/Qwen3-1p7b"``-style strings; ``None`` if absent."""
    match = _SIZE_RE.search(text)
    if not match:
        return None
    return float(match.group(1).replace("p", ".")) * 1e9


def run_params(cfg: dict[str, Any], run_name: str) -> float:
    """Parameter count of a run's model (see the module docstring)."""
    for entry in cfg["models"].values():
        if entry.get("run") == run_name and entry.get("size"):
            size = parse_size(str(entry["size"]))
            if size:
                return size
    size = parse_size(cfg["training"]["runs"][run_name]["base_model"])
    if size is None:
        raise ValueError(f"run {run_name}: cannot tell the model size (add `size` to its models entry)")
    return size


def plan_rows(cfg: dict[str, Any], runs: list[str] | None, peak_tflops: float, mfu: float) -> list[dict]:
    """One dict per run: tokens per step, params, FLOPs, GPU-hours, GPUs, wall hours."""
    if not 0 < mfu <= 1 or peak_tflops <= 0:
        raise ValueError("need 0 < mfu <= 1 and peak_tflops > 0")
    names = runs or list(cfg["training"]["runs"])
    rows = []
    for name in names:
        if name not in cfg["training"]["runs"]:
            raise ValueError(f"unknown run {name!r}")
        r = cfg["training"]["runs"][name]
        budget = r["max_prompt_tokens"] + r["max_response_tokens"]
        tokens = r["prompts_per_step"] * r["rollouts_per_prompt"] * budget
        params = run_params(cfg, name)
        flops_step = (6 + 2) * params * tokens
        gpu_hours = r["total_steps"] * flops_step / (peak_tflops * 1e12 * mfu) / 3600
        gpus = r["nodes"] * r["gpus_per_node"]
        rows.append({"run": name, "params": params, "tokens_per_step": tokens, "steps": r["total_steps"],
                     "flops_per_step": flops_step, "gpu_hours": gpu_hours, "gpus": gpus,
                     "wall_hours": gpu_hours / gpus if gpus else None})
    return rows


_GRES_RE = re.compile(r"gpu:(\d+)")


def job_reservations(plan: str) -> list[dict[str, Any]]:
    """One dict per cluster job of a ``snakemake -n`` plan: ``rule``, ``gpus``, ``hours`` (its
    ``runtime``, minutes / 60; 0 where the profile sets none). Local rules are left out."""
    jobs = []
    for block in re.split(r"^\[.*\]$", plan, flags=re.M):
        rule = re.search(r"^rule (\S+):$", block, re.M)
        line = re.search(r"^\s*resources: (.*)$", block, re.M)
        if not rule or not line:
            continue
        res = dict(item.partition("=")[::2] for item in line[1].split(", "))
        gres = _GRES_RE.search(res.get("gres", ""))
        gpus = int(res["gpu"]) if res.get("gpu", "").isdigit() else \
            int(res.get("nodes", "1")) * int(gres[1]) if gres else 0
        hours = int(res["runtime"]) / 60 if res.get("runtime", "").isdigit() else 0.0
        jobs.append({"rule": rule[1], "gpus": gpus, "hours": hours})
    return jobs


def plan_target(target: str, config: str) -> str:
    """Snakemake's dry run of ``target`` with the Slurm profile (run in the current directory)."""
    exe = shutil.which("snakemake") or str(Path(sys.executable).parent / "snakemake")
    argv = [exe, "-n", target, "--profile", "slurm"]
    if config != DEFAULT_CONFIG:
        argv += ["--configfile", config]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise ValueError(f"snakemake -n {target} failed:\n{(proc.stdout + proc.stderr)[-2000:]}")
    return proc.stdout


def print_reservations(target: str, jobs: list[dict[str, Any]]) -> None:
    by_rule: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        by_rule.setdefault(job["rule"], []).append(job)
    print(f"\n# target {target}: the Slurm reservation of its jobs (GPUs x time limit; an upper bound, "
          "workflow/profiles/default)")
    print(f"{'rule':<40}{'jobs':>6}{'GPUs/job':>10}{'h/job':>8}{'GPU-h':>10}")
    for rule, group in by_rule.items():
        gpus = sorted({j["gpus"] for j in group})
        hours = sorted({j["hours"] for j in group})
        reserved = sum(j["gpus"] * j["hours"] for j in group)
        print(f"{rule:<40}{len(group):>6}{'/'.join(map(str, gpus)):>10}"
              f"{'/'.join(f'{h:g}' for h in hours):>8}{reserved:>10.1f}")
    print(f"{'all':<40}{len(jobs):>6}{'':>10}{'':>8}{sum(j['gpus'] * j['hours'] for j in jobs):>10.1f}")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    rows = plan_rows(cfg, args.run, args.peak_tflops, args.mfu)
    print(f"# training cost upper bounds; peak {args.peak_tflops:g} TFLOP/s per GPU, MFU {args.mfu:.0%}; "
          "FLOPs = 8 x params x tokens per step (6 update + 2 generation)")
    header = f"{'run':<14}{'params':>8}{'tokens/step':>14}{'steps':>7}{'PFLOP/step':>12}{'GPU-h':>10}" \
             f"{'GPUs':>6}{'wall h':>9}"
    print(header)
    for r in rows:
        wall = f"{r['wall_hours']:.1f}" if r["wall_hours"] is not None else "cpu"
        print(f"{r['run']:<14}{r['params'] / 1e9:>7.1f}B{r['tokens_per_step']:>14,}{r['steps']:>7}"
              f"{r['flops_per_step'] / 1e15:>12.1f}{r['gpu_hours']:>10.1f}{r['gpus']:>6}{wall:>9}")
    total = sum(r["gpu_hours"] for r in rows)
    print(f"{'all':<14}{'':>8}{'':>14}{'':>7}{'':>12}{total:>10.1f}")
    for target in args.target or []:
        print_reservations(target, job_reservations(plan_target(target, args.config)))
    return 0
