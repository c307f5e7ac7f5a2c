"""Loading, validation and hashing of the envace experiment configuration.

One YAML file describes the whole experiment matrix (``config/config.yaml`` for the paper,
``config/smoke.yaml`` for CPU scale). It is validated against ``envace/schemas/config.schema.yaml``
(package data; ``workflow/schemas/config.schema.yaml`` is a link to it, where Snakemake's template
looks); a malformed file fails here, at parse time, with the path of the offending key.

Derived values that are not written in the file (the list of test-time-scaling setting ids) are
added by :func:`load_config` so every consumer — the Snakemake workflow and the CLI — sees the same
matrix.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from envace.common import settings
from envace.common.settings import EPISODE_DEFAULTS

#: the experiment config a command reads when given no ``--config`` (the paper's; relative to the
#: working directory, the repository root).
DEFAULT_CONFIG = "config/config.yaml"


class ConfigError(ValueError):
    """A configuration file is malformed; the message names the offending key."""


def schema() -> dict[str, Any]:
    """The JSON schema of the configuration (a dict, parsed once:
    :func:`envace.common.settings.config_schema`; read it, never change it)."""
    return settings.config_schema()


def _key_path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "<top level>"


def validate_config(cfg: Mapping[str, Any], *, source: str = "config") -> None:
    """Validate ``cfg`` against the schema and the cross-references between its sections.

    Raises :class:`ConfigError` naming the first offending key (schema errors first, then references
    such as a table row that names an unknown model).
    """
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(dict(cfg)), key=lambda e: (len(e.absolute_path), e.path))
    if errors:
        err = jsonschema.exceptions.best_match(errors)
        raise ConfigError(f"{source}: invalid value at '{_key_path(err)}': {err.message}")
    _check_references(cfg, source)


def _check_references(cfg: Mapping[str, Any], source: str) -> None:
    models = cfg["models"]
    runs = cfg["training"]["runs"]
    benchmarks = cfg["benchmarks"]

    def need(kind: str, name: str, pool: Mapping[str, Any], where: str) -> None:
        if name not in pool:
            raise ConfigError(f"{source}: '{where}' names unknown {kind} '{name}' (known: {sorted(pool)})")

    for mid, model in models.items():
        if model["kind"] == "trained":
            need("training run", model["run"], runs, f"models.{mid}.run")
    for table in ("table1", "table2"):
        block = cfg["evaluation"][table]
        for mid in block["models"]:
            need("model", mid, models, f"evaluation.{table}.models")
        for bench in block["benchmarks"]:
            need("benchmark", bench, benchmarks, f"evaluation.{table}.benchmarks")
    for bench in ours_benchmarks(cfg):
        need("benchmark", bench, benchmarks, "evaluation.ours_benchmarks")
        for where, paper in (("evaluation.table1.benchmarks", cfg["evaluation"]["table1"]["benchmarks"]),
                             ("tts.benchmarks", cfg["tts"]["benchmarks"])):
            if bench in paper:
                raise ConfigError(f"{source}: benchmark '{bench}' is in both evaluation.ours_benchmarks and "
                                  f"{where} (ours stay out of the paper's Overall)")
    ckpt = cfg["evaluation"]["checkpoints"]
    need("training run", ckpt["run"], runs, "evaluation.checkpoints.run")
    need("benchmark", ckpt["benchmark"], benchmarks, "evaluation.checkpoints.benchmark")
    last = runs[ckpt["run"]]["total_steps"]
    for step in ckpt["steps"]:
        if step > last:
            raise ConfigError(
                f"{source}: 'evaluation.checkpoints.steps' has step {step} beyond "
                f"training.runs.{ckpt['run']}.total_steps={last}"
            )
    tts = cfg["tts"]
    need("model", tts["actor"], models, "tts.actor")
    for name, mid in tts["rehearsers"].items():
        need("model", mid, models, f"tts.rehearsers.{name}")
    for bench in tts["benchmarks"]:
        need("benchmark", bench, benchmarks, "tts.benchmarks")
    settings = tts_settings(cfg)
    for row, setting in tts["table3"].items():
        if setting not in settings:
            raise ConfigError(f"{source}: 'tts.table3.{row}' names unknown TTS setting '{setting}'")
    for fig in ("fig3", "fig4"):
        block = cfg["report"][fig]
        flat = block.values() if fig == "fig3" else [m for sizes in block.values() for m in sizes.values()]
        for mid in flat:
            need("model", mid, models, f"report.{fig}")
    for ours, released in cfg.get("released", {}).items():
        need("model", ours, models, "released")
        need("model", released, models, f"released.{ours}")
        if released == ours or released in cfg["released"]:
            raise ConfigError(f"{source}: 'released.{ours}' must name another model, not one that is itself "
                              f"replaced ({released!r})")
        if models[released]["kind"] == "trained":
            raise ConfigError(f"{source}: 'released.{ours}' names {released!r}, a model of ours (kind "
                              "trained); a released checkpoint is a path (kind hf)")
    for run in cfg["report"].get("fig5_rehearse_runs", []):
        need("training run", run, runs, "report.fig5_rehearse_runs")
    learning = cfg["report"].get("learning")
    if learning:
        table1 = cfg["evaluation"]["table1"]["models"]
        for mid in learning_models(cfg):
            need("Table 1 model", mid, table1, "report.learning")
        extra = set(learning.get("seeds", [])) - set(cfg["seeds"])
        if extra and not cfg["evaluation"].get("one_job", False):
            raise ConfigError(f"{source}: 'report.learning.seeds' adds seeds {sorted(extra)} beyond "
                              "'seeds', which only the one-job evaluation runs (set 'evaluation.one_job: "
                              "true', or list only seeds of 'seeds')")
    fidelity = cfg["report"].get("fidelity", {})
    for mid in fidelity.get("models", []):
        need("model", mid, models, "report.fidelity.models")
    for bench in fidelity.get("benchmarks", []):
        need("benchmark", bench, benchmarks, "report.fidelity.benchmarks")
    for pair in fidelity.get("contrasts", []):
        for mid in pair:
            need("model", mid, fidelity.get("models", []), "report.fidelity.contrasts")
    if "trajectories" in fidelity:  # its evaluation files are every fidelity run's input: Table 1's
        table1 = cfg["evaluation"]["table1"]["models"]
        need("Table 1 model", fidelity["trajectories"], table1, "report.fidelity.trajectories")
    for name, bench in benchmarks.items():
        splits = set(bench.get("splits", []))
        for group, spec in bench["aggregate"]["groups"].items():
            unknown = set(spec["splits"]) - splits if splits else set()
            if unknown:
                raise ConfigError(
                    f"{source}: 'benchmarks.{name}.aggregate.groups.{group}' uses splits "
                    f"{sorted(unknown)} that are not in benchmarks.{name}.splits"
                )


def released_models(cfg: Mapping[str, Any]) -> dict[str, str]:
    """``released``: our model id -> the model id of the authors' released checkpoint (default none)."""
    return dict(cfg.get("released", {}))


def released_tts_settings(cfg: Mapping[str, Any]) -> list[str]:
    """The released-weights TTS suite's setting ids (``released-<id>``), when ``tts.actor`` has a released
    checkpoint; else none."""
    if cfg["tts"]["actor"] not in released_models(cfg):
        return []
    return [str(s) for s in settings.tts_settings(cfg["tts"], "released")]


def tts_models(cfg: Mapping[str, Any], setting: str) -> tuple[str, dict[str, str]]:
    """``(actor, rehearser name -> model id)`` of a TTS setting's suite: ``tts.actor`` and
    ``tts.rehearsers``, with each released model in place of ours in the ``released`` suite."""
    actor, rehearsers = str(cfg["tts"]["actor"]), {k: str(v) for k, v in cfg["tts"]["rehearsers"].items()}
    if settings.TTSSetting.parse(setting).suite == "released":
        swap = released_models(cfg)
        actor, rehearsers = swap.get(actor, actor), {k: swap.get(v, v) for k, v in rehearsers.items()}
    return actor, rehearsers


def tts_settings(cfg: Mapping[str, Any]) -> list[str]:
    """All test-time-scaling setting ids (:class:`envace.common.settings.TTSSetting`): ``no_tts``, then
    ``{mode}_n{N}_{rehearser}``."""
    return [str(s) for s in settings.tts_settings(cfg["tts"])]


def load_config(path: str | Path) -> dict[str, Any]:
    """Read, validate and complete a configuration file.

    Returns the validated dict with the derived key ``tts.settings`` added.
    Raises :class:`ConfigError` (a ``ValueError``) for a missing file, invalid YAML or an invalid key.
    """
    path = Path(path)
    try:
        cfg = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return complete_config(cfg, source=str(path))


def merge_config_files(paths: list[str | Path]) -> dict[str, Any]:
    """The config files merged in order as Snakemake's ``--configfile`` merges them, unvalidated: a
    mapping merges key by key, any other value (a list too) replaces. Mirrors ``snakemake.utils.
    update_config`` (this layer imports no framework; tests/common/test_config.py compares the two on the
    smoke configs)."""
    def merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
        for key, value in new.items():
            if isinstance(value, Mapping):
                if not isinstance(into.get(key), dict):
                    into[key] = {}
                merge(into[key], value)
            else:
                into[key] = value

    cfg: dict[str, Any] = {}
    for path in paths:
        merge(cfg, yaml.safe_load(Path(path).read_text()) or {})
    return cfg


def complete_config(cfg: Mapping[str, Any], *, source: str = "config") -> dict[str, Any]:
    """Validate an already-parsed config (e.g. Snakemake's ``config``) and add derived keys."""
    cfg = copy.deepcopy(dict(cfg))
    for derived in ("settings", "released_settings"):  # derived, never user-set
        cfg.get("tts", {}).pop(derived, None)
    validate_config(cfg, source=source)
    cfg["tts"]["settings"] = tts_settings(cfg)
    cfg["tts"]["released_settings"] = released_tts_settings(cfg)
    return cfg


def config_hash(obj: Any) -> str:
    """sha256 of the canonical JSON of ``obj`` (sorted keys), first 16 hex characters."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def eval_hash(cfg: Mapping[str, Any], model_id: str, benchmark: str) -> str:
    """The hash a result manifest for (model, benchmark) must carry.

    Covers exactly what changes that evaluation's numbers: the scale, the model entry (and, for a
    trained model, its training run), the benchmark entry (without its report-only ``aggregate``
    block: how the report averages samples never changes a sample), the evaluation sampling settings
    and episode rules, and the ``vllm serve`` flags (``serving.vllm``, when the config has them).
    Checkpoint models (``<run>-stepNNNN``) hash their run and step.
    """
    return config_hash({**_evaluation_key(cfg, benchmark), **_model_key(cfg, model_id)})


def weights_eval_hash(cfg: Mapping[str, Any], model_id: str, weights: str, benchmark: str, seed: int) -> str:
    """What one plain evaluation's samples depend on, without the model's name: :func:`eval_hash`'s
    fields with the model entry replaced by the ``weights`` it serves and its ``size`` (which sets its
    GPUs), plus the seed. Two model ids with the same hash get the same result file, sample for sample
    (at smoke scale several of the paper's models are the one tiny model): ``envace eval`` runs such an
    evaluation once and copies it."""
    return config_hash({**_evaluation_key(cfg, benchmark), "weights": weights,
                        "size": model_entry(cfg, model_id).get("size"), "seed": seed})


def _evaluation_key(cfg: Mapping[str, Any], benchmark: str) -> dict[str, Any]:
    """What every plain evaluation on ``benchmark`` depends on besides its model: the scale, the benchmark
    entry, the evaluation's sampling settings and episode rules, and the server flags."""
    return {
        "scale": cfg["scale"],
        "benchmark": _benchmark_key(cfg, benchmark),
        "sampling": cfg["evaluation"]["sampling"],
        "episode": cfg["evaluation"]["episode"],
        **_serving_key(cfg),
    }


def _benchmark_key(cfg: Mapping[str, Any], benchmark: str) -> dict[str, Any]:
    """The benchmark entry as far as it changes samples: without ``aggregate`` (report-only)."""
    return {k: v for k, v in cfg["benchmarks"][benchmark].items() if k != "aggregate"}


def tts_hash(cfg: Mapping[str, Any], setting: str, benchmark: str) -> str:
    """The hash a test-time-scaling manifest for (setting, benchmark) must carry.

    Covers the scale, the setting id, the ``tts`` block (without the derived settings lists and the
    report-only ``table3`` mapping), the setting's actor and rehearser models (:func:`tts_models`; with
    their training runs), the
    benchmark entry (without ``aggregate``), the evaluation sampling settings and episode rules and the
    ``vllm serve`` flags (when present).
    """
    tts = {k: v for k, v in cfg["tts"].items() if k not in ("settings", "released_settings", "table3")}
    actor, rehearsers = tts_models(cfg, setting)
    used = [actor, *rehearsers.values()]
    return config_hash(
        {
            "scale": cfg["scale"],
            "setting": setting,
            "tts": tts,
            "models": {m: _model_key(cfg, m) for m in used},
            "benchmark": _benchmark_key(cfg, benchmark),
            "sampling": cfg["evaluation"]["sampling"],
            "episode": cfg["evaluation"]["episode"],
            **_serving_key(cfg),
        }
    )


def _serving_key(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The server flags (``serving.vllm``) as a hash key; nothing for a config without them (the shipped
    example results predate them), so their hashes are unchanged."""
    serving = cfg.get("serving")
    return {"serving": serving["vllm"]} if serving and "vllm" in serving else {}


def episode_rules(run_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The episode rules of a ``training.runs`` entry: its ``episode`` block over the schema's defaults
    (:data:`envace.common.settings.EPISODE_DEFAULTS`). A run's spec hash (:func:`training_key`) holds
    them filled in, so a changed default re-runs the runs that rely on it."""
    return {**EPISODE_DEFAULTS, **(run_spec.get("episode", {}) or {})}


#: Episode rules added after results existed, whose default is the behaviour from before: at that default
#: they stay out of a run's spec hash (:func:`training_key`), so adding the switch leaves every result
#: valid; any other value is hashed like every rule.
HASH_NEUTRAL_DEFAULTS = {"rehearse_advantage": "train"}

#: The ``training`` keys besides ``runs`` that change every trained model (data, judge, reward and its
#: rules): part of each run's spec hash (:func:`training_key`).
TRAINING_SHARED_KEYS = ("data", "judge", "reward", "reward_rules")


def run_reward(cfg: Mapping[str, Any], run: str | None) -> str:
    """The reward a training run trains on: its own ``training.runs.<run>.reward``, else
    ``training.reward`` (default ``checklist``, the paper's)."""
    spec = cfg["training"]["runs"].get(run, {}) if run else {}
    return str(spec.get("reward") or cfg["training"].get("reward", "checklist"))


def training_key(cfg: Mapping[str, Any], run: str) -> dict[str, Any] | None:
    """What a training run's weights depend on: its ``training.runs`` entry plus the shared training
    settings (:data:`TRAINING_SHARED_KEYS`); ``None`` for a name that is not a run."""
    spec = cfg["training"]["runs"].get(run)
    if spec is None:
        return None
    shared = {k: cfg["training"].get(k) for k in TRAINING_SHARED_KEYS}
    episode = {k: v for k, v in episode_rules(spec).items() if HASH_NEUTRAL_DEFAULTS.get(k, object()) != v}
    return {"run": {**spec, "episode": episode}, **shared}


def _model_key(cfg: Mapping[str, Any], model_id: str) -> dict[str, Any]:
    """A model's entry and, for a trained model, its training (:func:`training_key`): what its outputs
    depend on."""
    model = model_entry(cfg, model_id)
    return {"model": model, "run": training_key(cfg, model.get("run", ""))}


def checkpoint_model_id(run: str, step: int) -> str:
    """Model id of an intermediate checkpoint, e.g. ``envace_8b-step0050``."""
    return f"{run}-step{step:04d}"


def figure5_models(cfg: Mapping[str, Any]) -> dict[int, str]:
    """Training step -> the model id whose ``evaluation.checkpoints.benchmark`` results are Figure 5's
    point: ``<run>-stepNNNN``, except the run's last step (``total_steps``) when the run's final model has
    a model id (same name as the run): that checkpoint *is* the final model (``envace eval
    --checkpoint-dir`` without ``--step`` serves the latest one), so it is evaluated once, as the final
    model, not a second time under a checkpoint id (the paper's 470 and the smoke run's 4 are both last
    steps: one evaluation job less at each scale)."""
    ckpt = cfg["evaluation"]["checkpoints"]
    run = ckpt["run"]
    last = cfg["training"]["runs"][run]["total_steps"]
    entry = cfg["models"].get(run, {})
    final = run if entry.get("kind") == "trained" and entry.get("run") == run else None
    return {s: final if s == last and final else checkpoint_model_id(run, s) for s in ckpt["steps"]}


def evaluation_pairs(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every (model id, benchmark) evaluated with all seeds, sorted: Tables 1-2 and the Figure 5
    points (:func:`figure5_models` on ``evaluation.checkpoints.benchmark``), each Table 1 and Table 2
    model and Figure 5 point also on every :func:`ours_benchmarks` one, and each released model
    (:func:`released_models`) wherever its counterpart is."""
    pairs = {
        (m, b)
        for table in ("table1", "table2")
        for m in cfg["evaluation"][table]["models"]
        for b in cfg["evaluation"][table]["benchmarks"]
    }
    ckpt = cfg["evaluation"]["checkpoints"]
    fig5 = list(figure5_models(cfg).values())
    pairs |= {(m, ckpt["benchmark"]) for m in fig5}
    tables = [*cfg["evaluation"]["table1"]["models"], *cfg["evaluation"]["table2"]["models"]]
    pairs |= {(m, b) for m in [*tables, *fig5] for b in ours_benchmarks(cfg)}
    swap = released_models(cfg)
    pairs |= {(swap[m], b) for m, b in pairs if m in swap}
    return sorted(pairs)


def learning_models(cfg: Mapping[str, Any]) -> list[str]:
    """The learning check's models (``report.learning``): its base, then its trained models; none
    without the block."""
    learning = cfg["report"].get("learning")
    return [learning["base"], *learning["models"]] if learning else []


def learning_seeds(cfg: Mapping[str, Any]) -> list[int]:
    """The seeds of the learning check (``report.learning.seeds``; default the evaluation's ``seeds``):
    its base and trained models are evaluated on :func:`ours_benchmarks` with these too."""
    learning = cfg["report"].get("learning") or {}
    return list(learning.get("seeds", cfg["seeds"]))


def eval_seeds(cfg: Mapping[str, Any], model_id: str, benchmark: str) -> list[int]:
    """The seeds ``model_id`` is evaluated with on ``benchmark``: ``seeds``, and for the learning check's
    models (``report.learning``: base and trained) on :func:`ours_benchmarks` also
    :func:`learning_seeds`. Tables and claims read ``seeds`` only; the learning check reads its own."""
    seeds = list(cfg["seeds"])
    if benchmark in ours_benchmarks(cfg) and model_id in learning_models(cfg):
        seeds += [s for s in learning_seeds(cfg) if s not in seeds]
    return seeds


def ours_benchmarks(cfg: Mapping[str, Any]) -> list[str]:
    """``evaluation.ours_benchmarks``: benchmarks of ours reported beside the paper's (default none)."""
    return list(cfg["evaluation"].get("ours_benchmarks", []))


def fig5_rehearse_runs(cfg: Mapping[str, Any]) -> list[str]:
    """``report.fig5_rehearse_runs``: the training runs whose per-step REHEARSE fidelity Figure 5 draws
    (default: ``evaluation.checkpoints.run``)."""
    return list(cfg["report"].get("fig5_rehearse_runs", [cfg["evaluation"]["checkpoints"]["run"]]))


def tts_benchmarks(cfg: Mapping[str, Any]) -> list[str]:
    """The benchmarks every TTS setting runs on: ``tts.benchmarks`` (the paper's Table 3 and Figure 6,
    whose Overall they make), then each of :func:`ours_benchmarks` (beside them, never in that Overall)."""
    return [*cfg["tts"]["benchmarks"], *ours_benchmarks(cfg)]


def model_entry(cfg: Mapping[str, Any], model_id: str) -> dict[str, Any]:
    """The ``models`` entry of a model id, or the derived entry of a checkpoint ``<run>-stepNNNN`` (kind
    trained); ConfigError for any other id."""
    if model_id in cfg["models"]:
        return dict(cfg["models"][model_id])
    run, sep, step = model_id.rpartition("-step")
    if sep and step.isdigit() and run in cfg["training"]["runs"]:
        return {"label": f"{run}@{int(step)}", "kind": "trained", "run": run, "step": int(step)}
    raise ConfigError(f"unknown model id '{model_id}' (not in models, not a <run>-stepNNNN checkpoint)")
