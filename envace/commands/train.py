"""``envace train``: train one run of ``training.runs``.

- ``gpus_per_node > 0`` (paper scale): hands over to the verl extension,
  ``envace.verl_ext.launch.launch(cfg, run, checkpoint_dir, done)`` (imported lazily; a clear error if
  that module is not installed).
- ``gpus_per_node == 0`` (smoke scale): the single-process CPU trainer (:mod:`envace.cpu_trainer`) on the
  training parquet (``--data``, default ``<paths.data>/cm2_train.parquet``, the output of
  ``envace data``). The base model is a local directory, the in-process tiny model at smoke scale when
  its directory does not exist, or a Hugging Face id. The reward is ``training.reward``:
  ``checklist`` (LLM judge at ``training.judge.base_url`` or ``$ENVACE_JUDGE_BASE_URL``) or
  ``reference_match`` (verifiable, :func:`envace.reward.reference_match_reward`).

Checkpoints go to ``--checkpoint-dir`` (never a Snakemake output); a re-submitted job resumes from the last
one. The done-file (JSON, written atomically) is written only after the last step.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from envace.config import config_hash, load_config


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="train one run of training.runs (verl on GPU, CPU trainer at "
                                            "smoke scale)")
    p.add_argument("--config", required=True, help="resolved config (YAML/JSON)")
    p.add_argument("--run", required=True, help="run id in training.runs")
    p.add_argument("--checkpoint-dir", required=True, help="checkpoints (outside Snakemake's outputs)")
    p.add_argument("--done", required=True, help="done-file written atomically at the end")
    p.add_argument("--data", help="training parquet (default: <paths.data>/cm2_train.parquet)")
    p.set_defaults(func=run)


def load_model(name: str, scale: str) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a local directory, the in-process tiny model (smoke scale, directory not
    built), or a Hugging Face id. The model is float32, in eval mode."""
    import torch

    path = Path(name)
    if (path / "config.json").is_file() or scale != "smoke":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
        model.eval()
        return model, AutoTokenizer.from_pretrained(name)
    from envace.tiny_model import tiny_model_and_tokenizer

    return tiny_model_and_tokenizer(0)


def make_reward_fn(cfg: dict[str, Any]) -> tuple[Any, Any]:
    """``(reward_fn(messages, example) -> RewardResult, judge or None)`` for ``training.reward``."""
    from envace import reward as rw

    kind = cfg["training"].get("reward", "checklist")
    if kind == "reference_match":
        return (lambda messages, ex: rw.reference_match_reward(messages, ex.reference_calls)), None
    judge_cfg = cfg["training"]["judge"]
    base_url = judge_cfg.get("base_url") or os.environ.get("ENVACE_JUDGE_BASE_URL")
    if not base_url:
        raise ValueError("training.reward is 'checklist' but no judge endpoint: set training.judge.base_url "
                         "or $ENVACE_JUDGE_BASE_URL")
    judge = rw.ChecklistJudge(rw.JudgeConfig(
        base_url=base_url, model=judge_cfg["model"],
        temperature=judge_cfg.get("temperature", 0.6), top_p=judge_cfg.get("top_p", 0.8),
        failure_policy=judge_cfg.get("failure_policy", "fail"),
        max_retries=judge_cfg.get("max_retries", 3), timeout_s=judge_cfg.get("timeout_s", 120.0),
    ))
    return (lambda messages, ex: rw.checklist_reward(messages, ex.checklists, judge)), judge


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("envace", "torch", "transformers", "verl"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    runs = cfg["training"]["runs"]
    if args.run not in runs:
        raise ValueError(f"unknown run {args.run!r}; training.runs has {sorted(runs)}")
    spec = runs[args.run]
    if spec["gpus_per_node"] > 0:
        try:
            from envace.verl_ext.launch import launch
        except ImportError as exc:
            print(f"envace train: run {args.run} needs the verl extension (gpus_per_node="
                  f"{spec['gpus_per_node']}), but envace.verl_ext.launch cannot be imported: {exc}",
                  file=sys.stderr)
            return 1
        return int(launch(cfg, args.run, args.checkpoint_dir, args.done))
    return _run_cpu(cfg, args)


def _run_cpu(cfg: dict[str, Any], args: argparse.Namespace) -> int:
    from envace.cpu_trainer import CpuTrainer, TrainerSettings
    from envace.data import read_training_parquet, write_json_atomic

    spec = cfg["training"]["runs"][args.run]
    settings = TrainerSettings.from_config(cfg, args.run)
    data = Path(args.data or Path(cfg["paths"]["data"]) / "cm2_train.parquet")
    if not data.is_file():
        raise FileNotFoundError(f"training data {data} not found (run `envace data` first)")
    examples = read_training_parquet(data)
    model, tokenizer = load_model(spec["base_model"], cfg["scale"])
    simulator = None
    if settings.algorithm == "grpo":
        if not spec.get("simulator"):
            raise ValueError(f"run {args.run}: algorithm grpo needs training.runs.{args.run}.simulator")
        simulator, _ = load_model(spec["simulator"], cfg["scale"])
    reward_fn, judge = make_reward_fn(cfg)
    log = lambda line: print(f"envace train [{args.run}]: {line}", flush=True)  # noqa: E731
    trainer = CpuTrainer(settings, examples, tokenizer, model, reward_fn, args.checkpoint_dir,
                         simulator=simulator, log=log)
    summary = trainer.train(judge_metrics=judge.metrics.as_dict if judge else None)
    summary.pop("last_metrics", None)
    done = {
        **summary,
        "trainer": "cpu",
        "scale": cfg["scale"],
        "run_hash": config_hash(spec),
        "total_steps": settings.total_steps,
        "resumed_from": trainer.resumed_from,
        "metrics": str(Path(args.checkpoint_dir) / "metrics.jsonl"),
        "data": str(data),
        "examples": len(examples),
        "reward": cfg["training"].get("reward", "checklist"),
        "versions": _versions(),
    }
    write_json_atomic(done, args.done)
    log(f"done: step {summary['final_step']} -> {args.done}")
    return 0
