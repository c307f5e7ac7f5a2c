"""Running one ``envace eval`` job's entries through its model servers.

Implemented: :func:`evaluate_entry` runs one model's unfinished runs (loads the benchmarks' tasks and the
tokenizers while the servers boot, then each run through :func:`envace.bench.runner.run_samples`, a TTS
setting as its episode function, :mod:`envace.bench.tts_episode`); each finished run's manifest gets the
job's ``serving`` record and the run is kept for a retry (:mod:`envace.common.kept_results`). A model
server's failure ends the entry with ``None`` and a message naming the dead servers (the partial file keeps
what finished).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from envace.common import kept_results
from envace.common.settings import TTSSetting
from envace.serve.eval_plan import Entry, EvalRun, model_path_of, rehearser_of, rehearsers, task_limit
from envace.serve.job import ServerJob, ServerNeed, dead_servers

__all__ = ["evaluate_entry"]


def evaluate_entry(job: ServerJob, args: argparse.Namespace, entry: Entry, todo: list[EvalRun],
                   needs: dict[str, ServerNeed]) -> int | None:
    """Run one entry's unfinished runs through the job's servers; the number of new samples, or None
    after a backend failure (reported; the partial file keeps what finished)."""
    from transformers import AutoTokenizer

    from envace.bench import get_adapter
    from envace.bench.runner import run_samples
    from envace.bench.tts_episode import tts_episode_fn
    from envace.core.environment import Endpoint, Services
    from envace.core.rollout import BackendError
    from envace.core.settings import evaluation_rollout
    from envace.serve.backends import VLLMCompletionsBackend, load_hf_backend

    cfg = job.cfg
    job.launch(needs, todo[0].out)
    # ---- while the servers boot: benchmarks, tasks, tokenizers
    adapters: dict[str, Any] = {}
    tasks: dict[str, list[Any]] = {}
    tts = any(r.setting for r in todo)
    for bench in dict.fromkeys(r.benchmark for r in todo):
        bcfg = dict(cfg["benchmarks"][bench])
        work = next(r.out for r in todo if r.benchmark == bench)
        adapters[bench] = get_adapter(bench, config=bcfg, work_dir=work.parent / f".{work.stem}.work")
        tasks[bench] = adapters[bench].load_tasks(list(bcfg["splits"]), task_limit(cfg, bench, tts))
    tokenizer = AutoTokenizer.from_pretrained(entry.model_path)
    rehearser_paths = {rid: model_path_of(cfg, rid) for rid in rehearsers(cfg, todo)}
    rehearser_tokenizers = {rid: tokenizer if rpath == entry.model_path
                            else AutoTokenizer.from_pretrained(rpath)
                            for rid, rpath in rehearser_paths.items()}
    hf_backends: dict[tuple[str, int], Any] = {}

    def hf_backend(path: str, seed: int) -> Any:
        """--backend hf: the model in-process, one instance per (path, seed)."""
        if (path, seed) not in hf_backends:
            hf_backends[(path, seed)] = load_hf_backend(path, seed)[0]
        return hf_backends[(path, seed)]

    def served_backend(path: str, seed: int) -> VLLMCompletionsBackend:
        srv = job.servers[path]
        return VLLMCompletionsBackend(srv.base_url, srv.served_name, server=srv, seed=seed)

    job.wait(needs)
    serving_record = job.serving_record(needs)
    default_concurrency = int(cfg["evaluation"].get("concurrency", 16))
    concurrency = args.concurrency or (1 if job.kind == "hf" else default_concurrency)
    rollout = evaluation_rollout(cfg)
    flags = {"user_simulator": args.user_simulator_url, "judge": args.judge_url}
    pick = hf_backend if job.kind == "hf" else served_backend
    new = 0
    for r in todo:
        bcfg = cfg["benchmarks"][r.benchmark]
        services = Services()
        for role, url in flags.items():
            name = bcfg.get(role)
            if url:
                services = _with(services, role, Endpoint(url, name or "default"))
            elif name:
                srv = job.servers[str(name)]
                services = _with(services, role, Endpoint(srv.base_url, srv.served_name))
        episode_fn = None
        rid = rehearser_of(cfg, r.setting)
        if rid is not None:
            rbackend = pick(rehearser_paths[rid], r.seed)
            episode_fn = tts_episode_fn(cfg["tts"], TTSSetting.parse(str(r.setting)), rbackend,
                                        rehearser_tokenizers[rid])
        manifest = {
            "model": r.setting or entry.model,
            "scale": cfg["scale"],
            "config_hash": r.config_hash,
            "git_commit": job.git_commit,
            "package_versions": {**job.versions, **adapters[r.benchmark].versions()},
        }
        try:
            path, stats = asyncio.run(
                run_samples(
                    adapter=adapters[r.benchmark],
                    tasks=tasks[r.benchmark],
                    samples=int(bcfg.get("samples", 1)),
                    seed=r.seed,
                    services=services,
                    backend_for=_sample_backends(pick(entry.model_path, r.seed)),
                    tokenizer=tokenizer,
                    config=rollout,
                    out=r.out,
                    manifest=manifest,
                    concurrency=concurrency,
                    progress=not args.no_progress,
                    episode_fn=episode_fn,
                    extra_timing=job.cpu_timing,
                )
            )
        except BackendError as exc:
            dead = dead_servers(job.servers.values())
            print(
                f"envace eval: error: {exc}\n{dead}Finished samples are kept in {r.out}.partial.jsonl; "
                "rerun the same command to resume.",
                file=sys.stderr,
            )
            return None
        kept_results.add_to_manifest(path, {"serving": serving_record})
        kept_results.keep(path)
        new += stats.samples
        if concurrency == 1:
            share = 1 - stats.model_s / stats.wall_s if stats.wall_s > 0 else 0.0
            where = f"{share:.0%} of the time outside the model"
        else:  # model time overlaps across samples in flight: no share of wall time
            where = f"{stats.model_s:.1f} s in model calls, summed over {concurrency} samples in flight"
        print(f"envace eval: wrote {path} ({stats.samples} new samples in {stats.wall_s:.1f} s, {where})",
              file=sys.stderr)
    return new


def _sample_backends(backend: Any) -> Any:
    """``backend_for(task, sample)``: a per-sample fork where the backend supports it (served models)."""
    fork = getattr(backend, "for_sample", None)
    if fork is None:
        return lambda task, sample: backend
    return lambda task, sample: fork(task.task_id, sample)


def _with(services: Any, role: str, endpoint: Any) -> Any:
    from dataclasses import replace

    return replace(services, **{role: endpoint})
