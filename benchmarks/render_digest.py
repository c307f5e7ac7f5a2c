"""Digest of every chat rendering of some records, to compare two transformers versions (ours).

Renders, with this interpreter's transformers, each prefix of each record's ``messages`` that ends at a
user or tool turn (``add_generation_prompt=True``), with and without the record's tools, thinking on and
off, then tokenizes it; prints one JSON object: the transformers version and a SHA-256 prefix of each
rendering's text + token ids (or the error it raised). Run it under both versions and compare the lists.
Needs only transformers and jinja2 (no torch), so a throw-away venv holds the other version:

    python -m venv /tmp/tf && /tmp/tf/bin/pip install transformers==5.9.0 jinja2
    /tmp/tf/bin/python benchmarks/render_digest.py models/smoke/tiny data/smoke/ledger_train.jsonl > a.json
    .venv/bin/python benchmarks/render_digest.py models/smoke/tiny data/smoke/ledger_train.jsonl > b.json

Usage: ``render_digest.py TOKENIZER_DIR RECORDS.jsonl [...] [--limit N]`` (N records per file, default 150).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import Any


def digests(tok: Any, record: dict[str, Any]) -> list[str]:
    msgs, tools = record["messages"], record.get("tools")
    out = []
    for cut in range(1, len(msgs) + 1):
        if msgs[cut - 1]["role"] == "assistant":
            continue
        for use_tools in (True, False):
            for think in (True, False):
                try:
                    text = tok.apply_chat_template(msgs[:cut], tools=tools if use_tools else None,
                                                   tokenize=False, add_generation_prompt=True,
                                                   enable_thinking=think)
                except Exception as e:  # noqa: BLE001 - the error itself is what is compared
                    out.append(f"error: {type(e).__name__}: {str(e)[:60]}")
                    continue
                ids = tok(text, add_special_tokens=False)["input_ids"]
                out.append(hashlib.sha256((text + json.dumps(ids)).encode()).hexdigest()[:16])
    return out


def main(argv: list[str] | None = None) -> int:
    import transformers
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tokenizer")
    ap.add_argument("records", nargs="+")
    ap.add_argument("--limit", type=int, default=150)
    args = ap.parse_args(argv)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    renderings: list[str] = []
    for path in args.records:
        with open(path) as fh:
            lines = [line for line in fh if line.strip()][: args.limit]
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                renderings.append("unreadable record")
                continue
            renderings += digests(tok, record)
    json.dump({"transformers": transformers.__version__, "renderings": renderings}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
