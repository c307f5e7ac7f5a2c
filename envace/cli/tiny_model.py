"""``envace tiny-model``: build the tiny Qwen3-architecture model and tokenizer for smoke scale.

Writes a directory loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer`` (see
:mod:`envace.serve.tiny_model`), then a done-file with what was built. Nothing is downloaded. The build's
settings come from the config's ``tiny_model`` block: ``seed`` and ``warmstart``, a list of SFT stages
(:class:`envace.train.warmstart.Stage`: records file(s), steps, lr, batch rows, behaviours, renderings)
run in order so the model emits parseable tool calls, rehearsals and answers and, as a simulated user,
plain-text requests; ``--seed`` / ``--warmstart JSON`` replace them (the smoke DAG passes both, from the
config). Each stage's losses go to the done-file and the log. The build pins its CPU numerics first
(:func:`envace.train.numerics.pin`: ``tiny_model.threads`` / ``--threads`` and AVX2 kernels), so the same
settings give the same weights on any x86-64 machine; the done-file records them (``numerics``).

Build cache (ours, off unless asked for): with ``--cache DIR`` (default: the environment variable
``ENVACE_TINY_MODEL_CACHE``) a build is stored as ``DIR/tiny-<key>`` and a later build with the same key
copies it instead of training again. The key (:func:`build_key`) hashes everything the build reads: the
seed and warm-start stages, each stage's records' bytes (not their paths), every file of the ``envace``
package, the torch and transformers versions and the pinned numerics (thread count and CPU kernels,
:mod:`envace.train.numerics`: a CPU SFT's float sums depend on both). The test suite builds through it,
and CI points the smoke DAG at the same folder, so one CI run warm-starts the model once; ``make smoke``
without the variable always builds. The done-file says whether the model came from the cache
(``cache.hit``) and under which key. Two builds of one key at once (the test suite's parallel workers, a
test run beside the smoke DAG) train it once: the key is locked (``DIR/tiny-<key>.lock``, ``flock``)
while it is looked up and built, and the second build waits, then copies.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from envace.common.config import DEFAULT_CONFIG

CACHE_ENV = "ENVACE_TINY_MODEL_CACHE"
DEFAULT_THREADS = 2  # tiny_model.threads' default (the schema's)
_PACKAGE = Path(__file__).resolve().parents[1]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tiny-model", help="build the tiny smoke-scale model (no download)")
    p.add_argument("--out", required=True, help="model directory")
    p.add_argument("--done", help="done-file (JSON) written last; default OUT/done.json")
    p.add_argument("--config", default=DEFAULT_CONFIG,
                   help="config whose tiny_model block gives the settings no flag gives "
                        "(default: %(default)s)")
    p.add_argument("--seed", type=int, help="seed of the random weights and the warm start (tiny_model.seed)")
    p.add_argument("--threads", type=int,
                   help="torch threads of the warm start, pinned with its CPU kernels (tiny_model.threads, "
                        f"default {DEFAULT_THREADS})")
    p.add_argument("--warmstart", type=_stages_json, metavar="JSON",
                   help="the warm-start stages as a JSON list (tiny_model.warmstart); '[]' = untrained")
    p.add_argument("--cache", default=os.environ.get(CACHE_ENV) or None,
                   help=f"build cache folder (default ${CACHE_ENV}; unset = always build): a build with "
                        "the same key is copied from DIR/tiny-<key> instead of trained again")
    p.set_defaults(func=run)


def _stages_json(text: str) -> list[Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError("a JSON list of stages")
    return value


def resolve_settings(args: argparse.Namespace) -> None:
    """Fill ``args.seed``, ``args.threads`` and ``args.stages`` (:class:`~envace.train.warmstart.Stage` s)
    from the flags, else from ``--config``'s ``tiny_model``; :class:`envace.common.config.ConfigError`
    names a setting neither gives, or a malformed stage (``tiny_model.warmstart[i].key``)."""
    from envace.common.config import ConfigError, load_config
    from envace.train.warmstart import Stage

    stages = args.warmstart
    args.threads = getattr(args, "threads", None)  # callers that build the namespace may leave it out
    if args.seed is None or stages is None or args.threads is None:
        tiny = load_config(args.config).get("tiny_model") or {}
        for key, flag in (("seed", "--seed"), ("warmstart", "--warmstart")):
            if getattr(args, key) is None and key not in tiny:
                raise ConfigError(f"{args.config}: tiny_model.{key} is not set (or pass {flag})")
        args.seed = tiny["seed"] if args.seed is None else args.seed
        stages = tiny["warmstart"] if stages is None else stages
        args.threads = tiny.get("threads", DEFAULT_THREADS) if args.threads is None else args.threads
    try:
        args.stages = [Stage.parse(spec, f"tiny_model.warmstart[{i}]") for i, spec in enumerate(stages)]
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def build_key(args: argparse.Namespace) -> str:
    """16 hex digits over everything the build reads (see the module docstring)."""
    from envace.train.numerics import X86_PINS

    def settings(stage: dict) -> dict:  # a stage's keys without its data paths (its mix parts' too)
        out = {k: v for k, v in stage.items() if k != "data"}
        if "mix" in out:
            out["mix"] = [settings(part) for part in out["mix"]]
        return out

    stages = [settings(stage.as_dict()) for stage in args.stages]
    h = hashlib.sha256(json.dumps({"seed": args.seed, "stages": stages}).encode())
    for stage in args.stages:
        for part in stage.parts():
            for path in part.data:
                h.update(hashlib.sha256(Path(path).read_bytes()).digest())
            h.update(b"\0")
    for path in sorted(_PACKAGE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(_PACKAGE)).encode() + b"\0" + path.read_bytes())
    for dist in ("torch", "transformers"):
        h.update(f"{dist}=={importlib.metadata.version(dist)}".encode())
    h.update(json.dumps({"threads": args.threads, "pins": X86_PINS, "machine": platform.machine()}).encode())
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


@contextlib.contextmanager
def _key_lock(cached: Path | None) -> Iterator[None]:
    """Hold an exclusive lock on the cache entry ``cached`` (none without a cache)."""
    if cached is None:
        yield
        return
    cached.parent.mkdir(parents=True, exist_ok=True)
    with open(cached.with_name(cached.name + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"tiny-model: waiting for another build of {cached.name}", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_fresh(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`_build` in a newly spawned interpreter: the numeric pins act only before a process's first
    tensor operation, and a caller (a test session, a notebook) may have run many."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_build, (args,))


def _build(args: argparse.Namespace) -> dict[str, Any]:
    """Build (and warm-start) the model into ``args.out``; returns the done-file's fields."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace.common.results import environment_fingerprint
    from envace.serve.tiny_model import build_tiny_model
    from envace.train.numerics import pin
    from envace.train.warmstart import sft

    numerics = pin(args.threads)  # before the first tensor operation
    out = build_tiny_model(args.out, seed=args.seed)
    model = AutoModelForCausalLM.from_pretrained(out)
    info: dict[str, Any] = {"path": str(out), "seed": args.seed,
                            "parameters": sum(p.numel() for p in model.parameters()), "numerics": numerics,
                            **environment_fingerprint(), "warmstart": []}
    if not args.stages:
        return info
    tokenizer = AutoTokenizer.from_pretrained(out)
    torch.manual_seed(args.seed)
    converted: dict[tuple[str, ...], list[Any]] = {}  # stages on the same records convert them once
    for i, stage in enumerate(args.stages):
        rows, n_examples = [], 0
        for part in stage.parts():
            if part.data not in converted:
                converted[part.data] = _examples(part, tokenizer)
            rows += part.rows(converted[part.data], tokenizer)
            n_examples += len(converted[part.data])
        t0 = time.perf_counter()
        losses = sft(model, rows, stage.steps, stage.lr, tokenizer.pad_token_id, batch_rows=stage.batch_rows,
                     seed=args.seed, after_step=_progress(i, stage.steps))
        info["warmstart"].append({**stage.as_dict(), "examples": n_examples, "rows": len(rows),
                                  "loss_first": losses[0], "loss_last": losses[-1],
                                  "seconds": round(time.perf_counter() - t0, 1)})
        print(f"tiny-model: warm-start stage {i + 1}/{len(args.stages)}: {len(rows)} rows from "
              f"{n_examples} examples, {stage.steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}",
              flush=True)
    model.save_pretrained(out)
    return info


def _examples(stage: Any, tokenizer: Any) -> list[Any]:
    """The stage's records (every file, in order) as training examples; bad records are skipped and
    counted, a stage with none is refused."""
    from envace.train.data import convert

    examples: list[Any] = []
    for path in stage.data:
        got, summary = convert(path, tokenizer, max_prompt_tokens=sys.maxsize)
        if summary.bad:
            print(f"tiny-model: skipped {len(summary.bad)} bad records of {path}", flush=True)
        examples.extend(got)
    if not examples:
        raise SystemExit(f"tiny-model: no usable CM2 records in {', '.join(stage.data)}")
    return examples


def _progress(index: int, steps: int) -> Any:
    """A progress line every ~10% of a long stage (SFT of thousands of steps takes minutes)."""
    every = max(100, steps // 10)

    def report(step: int, loss: float) -> None:
        if step % every == 0 and step < steps:
            print(f"tiny-model: stage {index + 1} step {step}/{steps}, loss {loss:.3f}", flush=True)
    return report


def run(args: argparse.Namespace) -> int:
    from envace.common.atomic import atomic_write_json

    resolve_settings(args)
    out = Path(args.out)
    cached = None
    if args.cache:
        key = build_key(args)
        cached = Path(args.cache) / f"tiny-{key}"
    with _key_lock(cached):
        if cached is not None and (cached / "build.json").is_file():
            _copy_whole(cached, out)
            info = json.loads((out / "build.json").read_text())
            info.update(path=str(out), cache={"key": key, "hit": True, "folder": str(cached)})
            for stage, done in zip(args.stages, info["warmstart"], strict=True):
                done["data"] = list(stage.data)  # same bytes; the paths this build was given
                for part, mixed in zip(stage.mix, done.get("mix", []), strict=True):
                    mixed["data"] = list(part.data)
            print(f"tiny-model: copied the cached build {cached} (key {key}; no training)", flush=True)
        else:
            info = _build_fresh(args)
            if cached is not None:
                (out / "build.json").write_text(json.dumps(info, indent=1))
                if not (cached / "build.json").is_file():  # another build of this key may have stored it
                    _copy_whole(out, cached)
                info["cache"] = {"key": key, "hit": False, "folder": str(cached)}
                print(f"tiny-model: stored the build in {cached}", flush=True)
    atomic_write_json(args.done or out / "done.json", info, indent=1, end="", parents=True)
    print(f"tiny-model: wrote {out} ({info['parameters']:,} parameters, seed {args.seed})")
    return 0
