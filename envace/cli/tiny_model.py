"""``envace tiny-model``: build the tiny Qwen3-architecture model and tokenizer for smoke scale.

Writes a directory loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer`` (see
:mod:`envace.serve.tiny_model`), then a done-file with what was built. Nothing is downloaded. The build's
settings come from the config's ``tiny_model`` block (``seed``, ``warmstart_steps``, ``warmstart_lr``,
``warmstart_batch_rows``) and its warm-start records from ``training.data.source``; a flag given on the
command line replaces the config's value (the smoke DAG passes them all, from the config). With
warm-start steps the model is first fine-tuned by SFT (:mod:`envace.train.warmstart`) so it emits
parseable tool calls and, as a simulated user, plain-text requests; the losses go to the done-file and
the log.

Build cache (ours, off unless asked for): with ``--cache DIR`` (default: the environment variable
``ENVACE_TINY_MODEL_CACHE``) a build is stored as ``DIR/tiny-<key>`` and a later build with the same key
copies it instead of training again. The key (:func:`build_key`) hashes everything the build reads: the
seed and warm-start settings, the warm-start records' bytes (not their path), every file of the ``envace``
package, the torch and transformers versions and torch's thread count (a CPU SFT's float sums depend on
it). The test suite builds through it, and CI points the smoke DAG at the same folder, so one CI run
warm-starts the model once; ``make smoke`` without the variable always builds. The done-file says whether
the model came from the cache (``cache.hit``) and under which key.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from envace.common.config import DEFAULT_CONFIG

CACHE_ENV = "ENVACE_TINY_MODEL_CACHE"
_PACKAGE = Path(__file__).resolve().parents[1]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tiny-model", help="build the tiny smoke-scale model (no download)")
    p.add_argument("--out", required=True, help="model directory")
    p.add_argument("--done", help="done-file (JSON) written last; default OUT/done.json")
    p.add_argument("--config", default=DEFAULT_CONFIG,
                   help="config whose tiny_model block and training.data.source give the settings a flag "
                        "does not (default: %(default)s)")
    p.add_argument("--seed", type=int, help="seed of the random weights and the warm start (tiny_model.seed)")
    p.add_argument("--warmstart-data",
                   help="CM2 records (JSON/JSONL/parquet) for the SFT warm start (training.data.source)")
    p.add_argument("--warmstart-steps", type=int, help="SFT steps, 0 = none (tiny_model.warmstart_steps)")
    p.add_argument("--warmstart-lr", type=float, help="SFT learning rate (tiny_model.warmstart_lr)")
    p.add_argument("--warmstart-batch-rows", type=int,
                   help="rows per SFT step, drawn with the seed (tiny_model.warmstart_batch_rows; unset: all "
                        "rows every step)")
    p.add_argument("--cache", default=os.environ.get(CACHE_ENV) or None,
                   help=f"build cache folder (default ${CACHE_ENV}; unset = always build): a build with "
                        "the same key is copied from DIR/tiny-<key> instead of trained again")
    p.set_defaults(func=run)


def resolve_settings(args: argparse.Namespace) -> None:
    """Fill every setting no flag gave from ``--config`` (``tiny_model``, ``training.data.source``);
    :class:`envace.common.config.ConfigError` names a setting that neither gives."""
    from envace.common.config import ConfigError, load_config

    needed = [args.seed, args.warmstart_steps] + ([args.warmstart_lr] if args.warmstart_steps else [])
    if all(v is not None for v in needed) and (args.warmstart_data or not args.warmstart_steps):
        return
    cfg = load_config(args.config)
    tiny = cfg.get("tiny_model") or {}

    def pick(flag: Any, key: str) -> Any:
        if flag is not None:
            return flag
        if key not in tiny:
            flag_name = "--" + key.replace("_", "-")
            raise ConfigError(f"{args.config}: tiny_model.{key} is not set (or pass {flag_name})")
        return tiny[key]

    args.seed = pick(args.seed, "seed")
    args.warmstart_steps = pick(args.warmstart_steps, "warmstart_steps")
    if args.warmstart_steps:
        args.warmstart_lr = pick(args.warmstart_lr, "warmstart_lr")
        if args.warmstart_batch_rows is None:
            args.warmstart_batch_rows = tiny.get("warmstart_batch_rows")
        args.warmstart_data = args.warmstart_data or cfg["training"]["data"]["source"]


def build_key(args: argparse.Namespace) -> str:
    """16 hex digits over everything the build reads (see the module docstring)."""
    import torch

    warm = bool(args.warmstart_data and args.warmstart_steps > 0)
    h = hashlib.sha256(json.dumps({"seed": args.seed, "steps": args.warmstart_steps if warm else 0,
                                   "lr": args.warmstart_lr if warm else None,
                                   "batch_rows": args.warmstart_batch_rows if warm else None}).encode())
    if warm:
        h.update(Path(args.warmstart_data).read_bytes())
    for path in sorted(_PACKAGE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(_PACKAGE)).encode() + b"\0" + path.read_bytes())
    for dist in ("torch", "transformers"):
        h.update(f"{dist}=={importlib.metadata.version(dist)}".encode())
    h.update(f"threads={torch.get_num_threads()}".encode())
    return h.hexdigest()[:16]


def _copy_whole(src: Path, dst: Path) -> None:
    """Copy folder ``src`` to ``dst`` so that ``dst`` appears whole or not at all (copy, then rename)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f".{dst.name}."))
    try:
        shutil.copytree(src, tmp / "x")
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(tmp / "x", dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _build(args: argparse.Namespace) -> dict[str, Any]:
    """Build (and warm-start) the model into ``args.out``; returns the done-file's fields."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace.serve.tiny_model import build_tiny_model

    out = build_tiny_model(args.out, seed=args.seed)
    model = AutoModelForCausalLM.from_pretrained(out)
    info: dict[str, Any] = {"path": str(out), "seed": args.seed,
                            "parameters": sum(p.numel() for p in model.parameters())}
    if args.warmstart_data and args.warmstart_steps > 0:
        from envace.train.data import convert
        from envace.train.warmstart import sft, sft_sequences

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
        losses = sft(model, rows, args.warmstart_steps, args.warmstart_lr, tokenizer.pad_token_id,
                     batch_rows=args.warmstart_batch_rows, seed=args.seed)
        model.save_pretrained(out)
        info["warmstart"] = {"data": args.warmstart_data, "examples": len(examples), "rows": len(rows),
                             "steps": args.warmstart_steps, "lr": args.warmstart_lr,
                             "batch_rows": args.warmstart_batch_rows,
                             "loss_first": losses[0], "loss_last": losses[-1],
                             "seconds": round(time.perf_counter() - t0, 1)}
        print(f"tiny-model: warm start {len(rows)} rows from {len(examples)} examples, "
              f"{args.warmstart_steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    return info


def run(args: argparse.Namespace) -> int:
    from envace.common.atomic import atomic_write_json

    resolve_settings(args)
    out = Path(args.out)
    cached = None
    if args.cache:
        key = build_key(args)
        cached = Path(args.cache) / f"tiny-{key}"
    if cached is not None and (cached / "build.json").is_file():
        _copy_whole(cached, out)
        info = json.loads((out / "build.json").read_text())
        info.update(path=str(out), cache={"key": key, "hit": True, "folder": str(cached)})
        if "warmstart" in info:
            info["warmstart"]["data"] = args.warmstart_data  # same bytes; the path this build was given
        print(f"tiny-model: copied the cached build {cached} (key {key}; no training)", flush=True)
    else:
        info = _build(args)
        if cached is not None:
            (out / "build.json").write_text(json.dumps(info, indent=1))
            if not (cached / "build.json").is_file():  # another build of this key may have stored it
                _copy_whole(out, cached)
            info["cache"] = {"key": key, "hit": False, "folder": str(cached)}
            print(f"tiny-model: stored the build in {cached}", flush=True)
    atomic_write_json(args.done or out / "done.json", info, indent=1, end="", parents=True)
    print(f"tiny-model: wrote {out} ({info['parameters']:,} parameters, seed {args.seed})")
    return 0
