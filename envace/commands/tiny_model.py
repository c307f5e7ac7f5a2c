"""``envace tiny-model``: build the tiny Qwen3-architecture model and tokenizer for smoke scale.

Writes a directory loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer`` (see
:mod:`envace.tiny_model`), then a done-file with what was built. Nothing is downloaded. With
``--warmstart-data`` (CM2 records; the smoke DAG passes ``training.data.source``) the model is first
fine-tuned for ``--warmstart-steps`` SFT steps (:mod:`envace.warmstart`) so it emits parseable tool calls
and, as a simulated user, plain-text requests; the losses go to the done-file and the log.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tiny-model", help="build the tiny smoke-scale model (no download)")
    p.add_argument("--out", required=True, help="model directory")
    p.add_argument("--done", help="done-file (JSON) written last; default OUT/done.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmstart-data", help="CM2 records (JSON/JSONL/parquet) for the SFT warm start")
    p.add_argument("--warmstart-steps", type=int, default=60, help="SFT steps (ours; 0 = no warm start)")
    p.add_argument("--warmstart-lr", type=float, default=3e-2, help="SFT learning rate (ours)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace.tiny_model import build_tiny_model

    out = build_tiny_model(args.out, seed=args.seed)
    model = AutoModelForCausalLM.from_pretrained(out)
    info: dict[str, Any] = {"path": str(out), "seed": args.seed,
                            "parameters": sum(p.numel() for p in model.parameters())}
    if args.warmstart_data and args.warmstart_steps > 0:
        from envace.data import convert
        from envace.warmstart import sft, sft_sequences

        tokenizer = AutoTokenizer.from_pretrained(out)
        examples, summary = convert(args.warmstart_data, tokenizer, max_prompt_tokens=sys.maxsize)
        if not examples:
            raise SystemExit(f"tiny-model: no usable CM2 records in {args.warmstart_data} "
                             f"({len(summary.bad)} bad)")
        if summary.bad:
            print(f"tiny-model: skipped {len(summary.bad)} bad records of {args.warmstart_data}", flush=True)
        rows = sft_sequences(examples, tokenizer)
        torch.manual_seed(args.seed)
        t0 = time.perf_counter()
        losses = sft(model, rows, args.warmstart_steps, args.warmstart_lr, tokenizer.pad_token_id)
        model.save_pretrained(out)
        info["warmstart"] = {"data": args.warmstart_data, "examples": len(examples), "rows": len(rows),
                             "steps": args.warmstart_steps, "lr": args.warmstart_lr,
                             "loss_first": losses[0], "loss_last": losses[-1],
                             "seconds": round(time.perf_counter() - t0, 1)}
        print(f"tiny-model: warm start {len(rows)} rows from {len(examples)} examples, "
              f"{args.warmstart_steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    done = Path(args.done or Path(args.out) / "done.json")
    done.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=done.parent, prefix=".done.")
    with os.fdopen(fd, "w") as fh:
        json.dump(info, fh, indent=1)
    os.replace(tmp, done)
    print(f"tiny-model: wrote {out} ({info['parameters']:,} parameters, seed {args.seed})")
    return 0
