"""Benchmark of the CPU trainer on the tiny model (a script, not a test).

Runs the smoke configuration's ``envace_8b`` run (shared roles, world rehearsal, role-wise GRPO) from
``config/smoke.yaml`` on the CM2 fixture with the in-process tiny model, real sampling for both roles,
and the verifiable reward, in a temporary checkpoint directory. Reports the warm-start time, then per RL
step the rollout and update time, generated and trained tokens, and steps/s over the timed steps
(checkpoint writes included, as in a real run).

Usage: ``python benchmarks/bench_cpu_trainer.py [--steps 4] [--warmstart-steps 80] [--run envace_8b]``
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from envace.commands.train import make_reward_fn
from envace.config import load_config
from envace.cpu_trainer import CpuTrainer, TrainerSettings
from envace.data import convert
from envace.tiny_model import tiny_model_and_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmstart-steps", type=int, default=None, help="default: the smoke config's")
    parser.add_argument("--run", default="envace_8b")
    args = parser.parse_args()

    cfg = load_config(ROOT / "config" / "smoke.yaml")
    if args.warmstart_steps is not None:
        cfg["training"]["cpu_trainer"]["warmstart_steps"] = args.warmstart_steps
    settings = TrainerSettings.from_config(cfg, args.run)
    settings.total_steps = args.steps
    settings.save_every = args.steps
    model, tok = tiny_model_and_tokenizer(0)
    examples, _ = convert(str(ROOT / "tests" / "data" / "cm2_fixture.jsonl"), tok, 3500)
    reward_fn, _ = make_reward_fn(cfg)
    simulator = tiny_model_and_tokenizer(1)[0] if settings.algorithm == "grpo" else None
    print(f"torch threads: {torch.get_num_threads()}; run {args.run}; {len(examples)} examples; "
          f"{settings.prompts_per_step} prompts x {settings.rollouts_per_prompt} rollouts; "
          f"max_response_tokens {settings.max_response_tokens}")
    with tempfile.TemporaryDirectory() as tmp:
        trainer = CpuTrainer(settings, examples, tok, model, reward_fn, tmp, simulator=simulator,
                             log=lambda line: None)
        t0 = time.perf_counter()
        warm = trainer.warm_start() if settings.warmstart_steps else []
        t_warm = time.perf_counter() - t0
        if warm:
            print(f"warm start: {len(warm)} SFT steps in {t_warm:.1f} s, "
                  f"loss {warm[0]:.3f} -> {warm[-1]:.3f}")
        settings.warmstart_steps = 0  # already done
        t0 = time.perf_counter()
        summary = trainer.train()
        wall = time.perf_counter() - t0
        for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines():
            m = json.loads(line)
            print(f"step {m['step']}: {m['time/step_s']:.2f} s (rollout {m['time/rollout_s']:.2f} s), "
                  f"generated {m['tokens/generated']} tokens, trained rows {m.get('actor/rows', 0):.0f} / "
                  f"response tokens {m.get('actor/response_tokens', 0):.0f}, "
                  f"reward {m.get('reward/mean', 0):.3f}, "
                  f"termination {m['termination']}")
    print(f"{summary['steps_run']} RL steps in {wall:.1f} s: {summary['steps_run'] / wall:.3f} steps/s")


if __name__ == "__main__":
    main()
