"""``envace tiny-model``: build the tiny Qwen3-architecture model and tokenizer for smoke scale.

Writes a directory loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer`` (see
:mod:`envace.tiny_model`), then a done-file with what was built. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tiny-model", help="build the tiny smoke-scale model (no download)")
    p.add_argument("--out", required=True, help="model directory")
    p.add_argument("--done", help="done-file (JSON) written last; default OUT/done.json")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from envace.tiny_model import build_tiny_model

    out = build_tiny_model(args.out, seed=args.seed)
    n_params = sum(p.numel() for p in _load(out).parameters())
    done = Path(args.done or Path(args.out) / "done.json")
    done.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=done.parent, prefix=".done.")
    with os.fdopen(fd, "w") as fh:
        json.dump({"path": str(out), "seed": args.seed, "parameters": n_params}, fh, indent=1)
    os.replace(tmp, done)
    print(f"tiny-model: wrote {out} ({n_params:,} parameters, seed {args.seed})")
    return 0


def _load(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)
