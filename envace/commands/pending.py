"""Command-line interfaces of the pipeline stages that later work fills in.

The Snakemake rules already call these commands with the flags defined here, so the DAG is complete
and its shape will not change when the implementations land. Until then each command validates its
arguments and the config, then exits with status 2 and names the issue that tracks it. Nothing here
pretends to have trained or evaluated anything.
"""

from __future__ import annotations

import argparse
import sys

from envace.config import load_config

#: subcommand -> (help, issue that implements it)
PENDING: dict[str, tuple[str, str]] = {
    "train": ("train one run of training.runs (verl on GPU, CPU trainer at smoke scale)", "#5"),
    "eval": ("evaluate a model on a benchmark with one seed -> per-sample JSONL + manifest", "#4 / #6"),
    "data": ("convert CM2 records to the training parquet", "#5"),
    "serve": ("start an OpenAI-compatible server for a model and wait for health", "#4"),
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help=PENDING["train"][0])
    p.add_argument("--config", required=True, help="resolved config (YAML/JSON)")
    p.add_argument("--run", required=True, help="run id in training.runs")
    p.add_argument("--checkpoint-dir", required=True, help="checkpoints (outside Snakemake's outputs)")
    p.add_argument("--done", required=True, help="done-file written atomically at the end")
    p.set_defaults(func=run, command_name="train")

    p = subparsers.add_parser("eval", help=PENDING["eval"][0])
    p.add_argument("--config", required=True)
    p.add_argument("--model", required=True, help="model id (models.* or <run>-stepNNNN)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-path", help="HF id or local directory")
    src.add_argument("--checkpoint-dir", help="training checkpoints of a trained model")
    p.add_argument("--step", type=int, help="checkpoint step (default: last)")
    p.add_argument("--benchmark", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--tts", choices=["none", "parallel", "sequential"], default="none")
    p.add_argument("--n", type=int, default=0, help="number of private rehearsals (TTS)")
    p.add_argument("--rehearser", help="model id of the rehearser (TTS)")
    p.add_argument("--out", required=True, help="per-sample JSONL; the manifest is written beside it")
    p.set_defaults(func=run, command_name="eval")

    p = subparsers.add_parser("data", help=PENDING["data"][0])
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--summary", required=True)
    p.set_defaults(func=run, command_name="data")

    p = subparsers.add_parser("serve", help=PENDING["serve"][0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.set_defaults(func=run, command_name="serve")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "config", None):
        load_config(args.config)  # a malformed config fails here, naming the key
    helptext, issue = PENDING[args.command_name]
    print(
        f"envace {args.command_name}: not implemented in this version ({helptext}; tracked in issue "
        f"{issue}). The command line is final; the Snakemake rules already call it.",
        file=sys.stderr,
    )
    return 2
