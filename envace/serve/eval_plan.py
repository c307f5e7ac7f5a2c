"""What one ``envace eval`` job runs: its evaluations, their result files and the servers each needs.

Implemented: the command line's single evaluation or a ``--plan`` file's items become :class:`Entry`
objects (one model's runs, or a rehearsal-fidelity item), each :class:`EvalRun` one result file with its
config hash (:func:`plan_entries`; a malformed plan item is a ``ConfigError`` naming the item and key, two
runs that would write one file are refused). :func:`server_needs` lists the model paths an entry's
unfinished runs need served (the model under test, TTS rehearsers, the benchmarks' user simulator and
judge unless given by URL) with their roles and GPUs (``resources.serve_gpus`` of the model's size, as the
Snakemake rule reserves). Nothing here starts a process: :mod:`envace.serve.eval_entries` runs the entries,
:class:`envace.serve.job.ServerJob` serves them, :mod:`envace.cli.eval` wires the two.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.common.settings import TTSSetting
from envace.serve.checkpoints import resolve_checkpoint
from envace.serve.job import ServerNeed

__all__ = ["EvalRun", "Entry", "PLAN_KEYS", "backend_kind", "entry_args", "model_path_of", "model_size",
           "plan_entries", "plan_runs", "rehearser_of", "rehearsers", "server_needs", "task_limit",
           "tts_settings_of"]


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


def model_size(cfg: dict[str, Any], model_id: str) -> str:
    """A model id's size class (``models.<id>.size``; a checkpoint id takes its run's model's), default 8B."""
    entry = cfg["models"].get(model_id)
    if entry is None:  # a checkpoint <run>-stepNNNN: the size of a model trained by that run
        run = model_id.rpartition("-step")[0]
        entry = next((m for m in cfg["models"].values() if m.get("run") == run), {})
    return str(entry.get("size", "8B"))


def backend_kind(choice: str) -> str:
    """How models run: ``hf`` in-process (``--backend hf``), else ``vllm`` (served)."""
    return "hf" if choice == "hf" else "vllm"


def server_needs(entry: Entry, todo: list[EvalRun], cfg: dict[str, Any], args: argparse.Namespace,
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
        need(entry.model_path, "rehearse", serve_gpus.get(model_size(cfg, entry.model), 1))
    elif kind == "vllm":
        gpus = args.gpus or serve_gpus.get(model_size(cfg, entry.model), 1)
        need(entry.model_path, "model", gpus)
        for rid in rehearsers(cfg, todo):
            need(model_path_of(cfg, rid), f"rehearser:{rid}", serve_gpus.get(model_size(cfg, rid), 1))
    flags = {"user_simulator": args.user_simulator_url, "judge": args.judge_url}
    for bench in dict.fromkeys(r.benchmark for r in todo):
        for role, url in flags.items():
            name = cfg["benchmarks"][bench].get(role)
            if name and not url:
                check_model_path(str(name), what=f"{bench} {role}")
                need(str(name), f"{bench}:{role}", serve_gpus.get("30B", 4))
    return needs
