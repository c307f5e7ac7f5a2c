"""``envace eval``: evaluate one model on one benchmark with one seed -> per-sample JSONL + manifest.

Implemented: reads the resolved config; resolves the model (``--model-path`` directory / HF id, or
``--checkpoint-dir`` with ``--step``, default the last step); serves it (on GPU each vLLM server gets its
own slice of the job's GPUs through ``CUDA_VISIBLE_DEVICES``: the model ``resources.serve_gpus[size]``,
each helper ``serve_gpus["30B"]``, matching what the Snakemake rule reserves) (``--backend``: ``vllm`` on GPU,
``transformers`` on CPU — ``auto`` picks by ``torch.cuda.is_available()`` — or ``hf``: our in-process
transformers route for tests and smoke, no server); serves the user simulator / judge models the
benchmark config names (``user_simulator``, ``judge``) with the same server kind (or uses
``--user-simulator-url`` / ``--judge-url``; on CPU all models of the job — model, rehearser, user
simulator, judge — share one ``transformers serve`` process that loads each model on first use, which
saves a server start per extra model); runs every (task, sample) of the configured splits (``limit``
tasks per split, ``samples`` per task, default 1) through :func:`envace.bench.runner.run_samples` with
the evaluation sampling settings and the seed; writes the result file + manifest (``config_hash`` =
:func:`envace.config.eval_hash`). Interrupted runs resume from ``<out>.partial.jsonl``. A server that
dies stops the run with exit code 1 and a message naming each dead server and its exit code; rerunning
the same command resumes.

Test-time scaling: ``--tts-setting ID`` (what the Snakemake rule passes: ``no_tts`` or
``{parallel|sequential}_n{N}_{rehearser name}`` from ``tts.settings``), or equivalently ``--tts MODE --n N
--rehearser MODEL_ID`` with a model named in ``tts.rehearsers``. Each sample then runs
:func:`envace.tts.run_tts` (N private rehearsals by the rehearser, a summary, one commit in the real
episode); ``no_tts`` runs the plain episode but is keyed and stored as a TTS result. The manifest's
``model`` is the setting id and its ``config_hash`` :func:`envace.config.tts_hash`.

Checkpoint layout read (ours, pending the training issue): ``<dir>/step<N>`` / ``<dir>/step_<N>`` /
``<dir>/global_step_<N>``, each either an HF model directory or holding one under ``huggingface/`` or
``actor/huggingface/``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HELP = "evaluate a model on a benchmark with one seed -> per-sample JSONL + manifest"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help=HELP, description=HELP)
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
    p.add_argument("--rehearser", help="model id of the rehearser (TTS), one of tts.rehearsers")
    p.add_argument("--tts-setting", help="TTS setting id from tts.settings (replaces --tts/--n/--rehearser)")
    p.add_argument("--out", required=True, help="per-sample JSONL; the manifest is written beside it")
    p.add_argument(
        "--backend",
        choices=["auto", "vllm", "transformers", "hf"],
        default="auto",
        help="how the model under test runs (ours; 'hf' = in-process, no server)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help="samples in flight (default: 1 for hf/transformers, 16 for vllm)",
    )
    p.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for a server")
    p.add_argument(
        "--gpus",
        type=int,
        help="GPUs (tensor-parallel size) of the model's vLLM server "
        "(default: resources.serve_gpus of the model's size, as the Snakemake rule reserves)",
    )
    p.add_argument("--max-prompt-tokens", type=int, default=12288, help="initial prompt limit (paper: 12k)")
    p.add_argument("--user-simulator-url", help="use this OpenAI-compatible /v1 endpoint instead of serving")
    p.add_argument("--judge-url", help="use this OpenAI-compatible /v1 endpoint instead of serving")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run, command_name="eval")


def resolve_checkpoint(ckpt_dir: str | Path, step: int | None) -> Path:
    """The HF model directory of ``step`` (default: the highest) under ``ckpt_dir``."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint directory {root} does not exist")
    found: dict[int, Path] = {}
    for child in root.iterdir():
        m = re.fullmatch(r"(?:global_step_|step_?)(\d+)", child.name)
        if m and child.is_dir():
            found[int(m.group(1))] = child
    if not found:
        raise FileNotFoundError(f"no step<N>/global_step_<N> checkpoints in {root}")
    chosen = max(found) if step is None else step
    if chosen not in found:
        raise FileNotFoundError(f"checkpoint step {chosen} not in {root} (have {sorted(found)})")
    for sub in ("", "huggingface", "actor/huggingface"):
        path = found[chosen] / sub
        if (path / "config.json").exists():
            return path
    raise FileNotFoundError(f"{found[chosen]}: no HF model (config.json) in it or its huggingface/ folder")


def _backend_kind(choice: str) -> str:
    if choice != "auto":
        return choice
    import torch

    return "vllm" if torch.cuda.is_available() else "transformers"


def tts_setting(args: argparse.Namespace, cfg: dict[str, Any]) -> str | None:
    """The TTS setting id of this run, or None for a plain evaluation. Raises ConfigError if unknown."""
    from envace.config import ConfigError

    if args.tts_setting:
        setting = args.tts_setting
    elif args.tts == "none":
        return None
    else:
        names = {model: name for name, model in cfg["tts"]["rehearsers"].items()}
        if args.rehearser not in names:
            raise ConfigError(
                f"--rehearser must be one of tts.rehearsers {sorted(names)}, got {args.rehearser!r}"
            )
        setting = f"{args.tts}_n{args.n}_{names[args.rehearser]}"
    if setting not in cfg["tts"]["settings"]:
        raise ConfigError(f"unknown TTS setting {setting!r} (known: {cfg['tts']['settings']})")
    return setting


def model_path_of(cfg: dict[str, Any], model_id: str) -> str:
    """Where a model id's weights are: its path, or the last checkpoint of its training run."""
    entry = cfg["models"][model_id]
    if entry["kind"] == "trained":
        return str(resolve_checkpoint(Path(cfg["paths"]["checkpoints"]) / entry["run"], None))
    return str(entry["path"])


def run(args: argparse.Namespace) -> int:
    from envace.bench import get_adapter
    from envace.bench.base import Endpoint, Services
    from envace.bench.runner import BackendError, run_samples
    from envace.config import ConfigError, eval_hash, load_config, tts_hash
    from envace.results import current_git_commit, installed_versions
    from envace.rollout import Mode, RolloutConfig
    from envace.serving import ServedModel, Server, ServerError, install_signal_handlers

    cfg = load_config(args.config)
    if args.benchmark not in cfg["benchmarks"]:
        raise ConfigError(f"benchmark {args.benchmark!r} is not in the config's benchmarks")
    setting = tts_setting(args, cfg)
    config_hash = (
        tts_hash(cfg, setting, args.benchmark) if setting else eval_hash(cfg, args.model, args.benchmark)
    )
    bcfg = dict(cfg["benchmarks"][args.benchmark])
    model_path = args.model_path or str(resolve_checkpoint(args.checkpoint_dir, args.step))
    out = Path(args.out)
    kind = _backend_kind(args.backend)
    server_kind = "vllm" if kind == "vllm" else "transformers"
    device = "cuda" if server_kind == "vllm" else "cpu"
    install_signal_handlers()
    log_dir = out.parent / "serve_logs"

    def multi_model_server() -> Server:
        """CPU: the job's one ``transformers serve``, no model pinned (see the module docstring)."""
        return Server(server_kind, "", ready_timeout=args.ready_timeout, seed=args.seed, device=device,
                      log_path=log_dir / f"{out.stem}.server.log")

    # boot it now, while the benchmark and its tasks load
    early = multi_model_server().launch() if kind == "transformers" else None
    adapter = get_adapter(args.benchmark, config=bcfg, work_dir=out.parent / f".{out.stem}.work")
    tasks = adapter.load_tasks(list(bcfg["splits"]), bcfg.get("limit"))
    sampling = cfg["evaluation"]["sampling"]
    rollout = RolloutConfig(
        mode=Mode.REAL,
        max_turns=int(sampling["max_turns"]),
        max_prompt_tokens=args.max_prompt_tokens,
        max_response_tokens=int(sampling["max_tokens"]),
        act_sampling={k: sampling[k] for k in ("temperature", "top_p", "max_tokens") if k in sampling},
    )
    with ExitStack() as stack:
        servers: dict[str, Server] = {}
        gpu_pool = _visible_gpus() if server_kind == "vllm" else []
        serve_gpus = cfg.get("resources", {}).get("serve_gpus", {})

        shared: list[Server] = []  # CPU: one multi-model `transformers serve` for every model of the job

        def serve(path: str, role: str) -> Server | ServedModel:
            if server_kind == "transformers":
                if not shared:
                    srv = early
                    if srv is None:  # --backend hf: a server only for the user simulator / judge
                        srv = multi_model_server().launch()
                        stack.callback(srv.stop)
                    shared.append(srv.wait_ready())
                return ServedModel(shared[0], path)
            if path not in servers:
                if role == "model":
                    n = args.gpus or serve_gpus.get(_model_size(cfg, args.model), 1)
                elif role == "rehearser":
                    n = serve_gpus.get(_model_size(cfg, rehearser_id), 1)
                else:  # helpers: the 30B user simulator / judge (as common.smk)
                    n = serve_gpus.get("30B", 4)
                if len(gpu_pool) < n:
                    raise ServerError(f"{role} server needs {n} GPUs, only {len(gpu_pool)} left")
                env = {"CUDA_VISIBLE_DEVICES": ",".join(gpu_pool[:n])}
                del gpu_pool[:n]
                servers[path] = stack.enter_context(
                    Server(
                        server_kind,
                        path,
                        ready_timeout=args.ready_timeout,
                        gpus=n,
                        seed=args.seed,
                        device=device,
                        env=env,
                        log_path=log_dir / f"{out.stem}.{role}.log",
                    )
                )
            return servers[path]

        if early is not None:
            stack.callback(early.stop)  # also when no model ends up asking for it
        rehearser_id = (
            cfg["tts"]["rehearsers"][setting.rsplit("_", 1)[1]] if setting not in (None, "no_tts") else None
        )
        try:
            backend, tokenizer = _model_backend(kind, model_path, args.seed, serve)
            episode_fn = None
            if rehearser_id is not None:
                rehearser_path = model_path_of(cfg, rehearser_id)
                rehearser = (
                    (backend, tokenizer)
                    if rehearser_path == model_path
                    else _model_backend(kind, rehearser_path, args.seed, serve, role="rehearser")
                )
                episode_fn = _tts_episode_fn(cfg, setting, *rehearser)
            services = Services()
            for role, flag in (("user_simulator", args.user_simulator_url), ("judge", args.judge_url)):
                name = bcfg.get(role)
                if flag:
                    services = _with(services, role, Endpoint(flag, name or "default"))
                elif name:
                    srv = serve(str(name), role)
                    services = _with(services, role, Endpoint(srv.base_url, srv.served_name))
        except ServerError as exc:
            print(f"envace eval: error: {exc}", file=sys.stderr)
            return 1
        manifest = {
            "model": setting or args.model,
            "scale": cfg["scale"],
            "config_hash": config_hash,
            "git_commit": current_git_commit(),
            "package_versions": {**installed_versions(), **adapter.versions()},
        }
        concurrency = args.concurrency or (16 if kind == "vllm" else 1)
        try:
            path, stats = asyncio.run(
                run_samples(
                    adapter=adapter,
                    tasks=tasks,
                    samples=int(bcfg.get("samples", 1)),
                    seed=args.seed,
                    services=services,
                    backend_for=lambda task, sample: backend,
                    tokenizer=tokenizer,
                    config=rollout,
                    out=out,
                    manifest=manifest,
                    concurrency=concurrency,
                    progress=not args.no_progress,
                    episode_fn=episode_fn,
                    extra_timing=lambda: _cpu_timing([*servers.values(), *shared]),
                )
            )
        except BackendError as exc:
            dead = _dead_servers([*servers.values(), *shared])
            print(
                f"envace eval: error: {exc}\n{dead}Finished samples are kept in {out}.partial.jsonl; rerun "
                "the same command to resume.",
                file=sys.stderr,
            )
            return 1
    share = 1 - stats.model_s / stats.wall_s if stats.wall_s > 0 else 0.0
    print(
        f"envace eval: wrote {path} ({stats.samples} new samples in {stats.wall_s:.1f} s, "
        f"{share:.0%} of the time outside the model)",
        file=sys.stderr,
    )
    return 0


def _cpu_timing(servers: Any) -> dict[str, float]:
    """CPU seconds so far of this job's model servers (model compute) and of this process (harness,
    benchmark environment, imports; with ``--backend hf`` also the in-process model)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    return {"server_cpu_s": sum(srv.cpu_seconds() for srv in servers),
            "process_cpu_s": own.ru_utime + own.ru_stime}


def _dead_servers(servers: Any) -> str:
    """One line per server whose process has exited. Each gets up to 2 s to be reaped: the backend sees
    the dropped connection a moment before the process is gone, so its own check can miss the death."""
    lines = []
    for srv in servers:
        code = srv.exit_code(wait=2.0)
        if code is not None:
            what = srv.model_path or "this job's models"
            lines.append(f"envace eval: the {srv.kind} server of {what} died (its process exited "
                         f"with code {code}); server log: {srv.log_path}\n")
    return "".join(lines)


def _visible_gpus() -> list[str]:
    """GPU ids this job may use: ``CUDA_VISIBLE_DEVICES`` (Slurm sets it) or all devices torch sees."""
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [g for g in visible.split(",") if g]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def _model_size(cfg: dict[str, Any], model_id: str) -> str:
    entry = cfg["models"].get(model_id)
    if entry is None:  # a checkpoint <run>-stepNNNN: the size of a model trained by that run
        run = model_id.rpartition("-step")[0]
        entry = next((m for m in cfg["models"].values() if m.get("run") == run), {})
    return str(entry.get("size", "8B"))


def _with(services: Any, role: str, endpoint: Any) -> Any:
    from dataclasses import replace

    return replace(services, **{role: endpoint})


def _tts_episode_fn(cfg: dict[str, Any], setting: str, rehearser: Any, rehearser_tokenizer: Any) -> Any:
    """An episode function for :func:`envace.bench.runner.run_samples` running test-time scaling."""
    from envace.bench.runner import BackendError
    from envace.tts import TTSConfig, run_tts

    mode, n, _ = setting.split("_")
    tts = cfg["tts"]

    async def episode_fn(
        task: Any, episode: Any, backend: Any, tokenizer: Any, config: Any
    ) -> dict[str, Any]:
        tts_config = TTSConfig(
            mode=mode,
            n=int(n[1:]),
            rollout=config,
            attempt_max_tokens=int(tts["attempt_max_tokens"]),
            memory_max_tokens=int(tts["memory_max_tokens"]),
        )
        try:
            result = await run_tts(
                task,
                episode,
                actor=backend,
                actor_tokenizer=tokenizer,
                rehearser=rehearser,
                rehearser_tokenizer=rehearser_tokenizer,
                config=tts_config,
            )
        except BackendError:
            raise
        except Exception as exc:  # e.g. the simulated user's opening failed: a failed sample, never a crash
            reason = f"{type(exc).__name__}: {exc}"
            return {"score": 0.0, "subscores": {}, "status": "failed", "reason": reason, "extra": {}}
        return result.fields

    return episode_fn


def _model_backend(kind: str, model_path: str, seed: int, serve: Any, role: str = "model") -> tuple[Any, Any]:
    from envace.backends import TextCompletionsBackend, VLLMCompletionsBackend, load_hf_backend

    if kind == "hf":
        return load_hf_backend(model_path, seed)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    srv = serve(model_path, role)
    if kind == "vllm":
        return VLLMCompletionsBackend(srv.base_url, srv.served_name, server=srv, seed=seed), tokenizer
    return TextCompletionsBackend(srv.base_url, srv.served_name, tokenizer, server=srv, seed=seed), tokenizer
