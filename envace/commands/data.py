"""``envace data``: CM2 records -> the training parquet (see :mod:`envace.data`) and a summary JSON.

The source is ``training.data.source`` (local JSON / JSONL / parquet, or a Hugging Face dataset id loaded
with ``datasets``); prompts over ``training.data.max_prompt_tokens_filter`` tokens (default 3,500,
authors' script) are dropped, counted with the tokenizer of the base model of the first run in
``training.runs`` (or ``--tokenizer``). At smoke scale, when the tiny model directory does not exist yet,
the tiny tokenizer is built in-process (it is deterministic). Bad records are reported on stderr with
their index and reason and counted in the summary; the command fails only if no record is usable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from envace.config import load_config

DEFAULT_MAX_PROMPT_TOKENS = 3500  # authors' script


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("data", help="convert CM2 records to the training parquet")
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True, help="training parquet")
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
        from envace.tiny_model import build_tiny_tokenizer

        return build_tiny_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


def run(args: argparse.Namespace) -> int:
    from envace.data import convert, write_json_atomic, write_training_parquet

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
        write_json_atomic(summary.to_dict(), args.summary)
        raise ValueError(f"no usable record in {data_cfg['source']} (see {args.summary})")
    write_training_parquet(examples, args.out)
    out = summary.to_dict()
    out["tokenizer"] = tok_name
    write_json_atomic(out, args.summary)
    print(f"envace data: {summary.kept} of {summary.total} records kept ({len(summary.bad)} bad, "
          f"{len(summary.filtered)} over {limit} prompt tokens) -> {args.out}")
    return 0
