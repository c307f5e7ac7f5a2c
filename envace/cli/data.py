"""``envace data``: CM2 records -> the training parquet (see :mod:`envace.train.data`) and a summary JSON.

The source is ``training.data.source`` (local JSON / JSONL / parquet, or a Hugging Face dataset id loaded
with ``datasets``); prompts over ``training.data.max_prompt_tokens_filter`` tokens (default 3,500,
authors' script) are dropped, counted with the tokenizer of the base model of the first run in
``training.runs`` (or ``--tokenizer``). At smoke scale, when the tiny model directory does not exist yet,
the tiny tokenizer is built in-process (it is deterministic). Bad records are reported on stderr with
their index and reason and counted in the summary; the command fails only if no record is usable.
With ``--val-out``, the last ``training.data.val_examples`` usable records (authors' script: 100) form
verl's validation parquet and are left out of the training parquet; without it (or with 0) verl
validates on the training set.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from envace.common.config import DEFAULT_CONFIG, load_config

DEFAULT_MAX_PROMPT_TOKENS = 3500  # authors' script


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("data", help="convert CM2 records to the training parquet")
    p.add_argument("--config", default=DEFAULT_CONFIG,
                   help="experiment config (training.data: source and filters) (default: %(default)s)")
    p.add_argument("--out", required=True, help="training parquet")
    p.add_argument("--val-out", help="validation parquet: the last training.data.val_examples usable "
                   "records, held out of the training parquet (default: no split)")
    p.add_argument("--summary", required=True, help="summary JSON (counts, bad and filtered records)")
    p.add_argument("--tokenizer", help="tokenizer for the length filter (default: first run's base model)")
    p.set_defaults(func=run)


def load_tokenizer(name: str, scale: str) -> Any:
    """A chat-template tokenizer: a local directory, the in-process tiny tokenizer (smoke scale, directory
    not built yet), or a Hugging Face id."""
    path = Path(name)
    if (path / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    if scale == "smoke":
        from envace.serve.tiny_model import build_tiny_tokenizer

        return build_tiny_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


def run(args: argparse.Namespace) -> int:
    from envace.common.atomic import atomic_write_json
    from envace.train.data import convert, write_training_parquet

    cfg = load_config(args.config)
    data_cfg = cfg["training"].get("data") or {}
    if not data_cfg.get("source"):
        raise ValueError("training.data.source is not set")
    limit = int(data_cfg.get("max_prompt_tokens_filter", DEFAULT_MAX_PROMPT_TOKENS))
    tok_name = args.tokenizer or next(iter(cfg["training"]["runs"].values()))["base_model"]
    tokenizer = load_tokenizer(tok_name, cfg["scale"])
    examples, summary = convert(data_cfg["source"], tokenizer, limit,
                                log=lambda line: print(f"envace data: {line}", file=sys.stderr))
    if not examples:
        atomic_write_json(args.summary, summary.to_dict(), indent=2, ensure_ascii=False, parents=True)
        raise ValueError(f"no usable record in {data_cfg['source']} (see {args.summary})")
    n_val = int(data_cfg.get("val_examples", 0)) if args.val_out else 0
    if n_val and n_val >= len(examples):
        raise ValueError(f"training.data.val_examples={n_val} leaves no training record "
                         f"({len(examples)} usable in {data_cfg['source']})")
    train, val = (examples[:-n_val], examples[-n_val:]) if n_val else (examples, examples)
    write_training_parquet(train, args.out)
    if args.val_out:
        write_training_parquet(val, args.val_out)
    out = summary.to_dict()
    out.update(tokenizer=tok_name, train_examples=len(train), val_examples=n_val)
    atomic_write_json(args.summary, out, indent=2, ensure_ascii=False, parents=True)
    print(f"envace data: {summary.kept} of {summary.total} records kept ({len(summary.bad)} bad, "
          f"{len(summary.filtered)} over {limit} prompt tokens) -> {args.out} ({len(train)} train)"
          + (f", {args.val_out} ({len(val)} validation)" if args.val_out else ""))
    return 0
