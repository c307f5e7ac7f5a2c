"""Held-out evaluation of an in-process model: task success in the real environment and rehearsal
fidelity, with the paired interval of a change (issue "Smoke scale that shows the science").

One evaluator for the learning test (``tests/learning``) and the measurement scripts
(``benchmarks/ledger_learnability.py``, ``benchmarks/ledger_rl.py``); ours, smoke scale.

Implemented:
- :func:`load_model` — a saved HF model folder (a warm start, or a verl checkpoint's ``huggingface``
  export) and its tokenizer, on CPU, in eval mode.
- :func:`task_success` — ``samples`` episodes per task of one split in the REAL environment, through the
  evaluation's own runner (:func:`envace.bench.runner.run_samples`, :func:`envace.core.episode.run_episode`,
  the adapter's environment and scoring), sampled by :class:`envace.serve.tiny_model.HFGenerateBackend`
  (``model.generate``; not ``vllm serve``: no server start per model). Returns the per-sample result
  lines.
- :func:`reference_fidelity` — the model as REHEARSE on every (call, real observation) pair of the
  tasks' *reference* dialogues (``records``, CM2-shaped), scored by :func:`envace.core.fidelity.score_pair`
  (``exact``: JSON equality with the real observation). Reference pairs rather than the model's own
  trajectories, so that two models are compared on the same pairs; the REHEARSE prompt shows no
  reference response (test time) or, ``with_references=True``, the record's own (as in training).
- :func:`by_task` / :func:`paired_gain` — values grouped by task, and the paired bootstrap interval of
  ``after - before`` over the tasks both hold (:func:`envace.common.stats.bootstrap_paired_diff`).

``enable_thinking=False`` renders every chat as verl's training rollouts do (the runs'
``episode.enable_thinking: false``); ``True`` passes no template argument (the template's default, what
``envace eval`` renders). Simplification: one backend and one sampling stream for all episodes, run one
after another (``concurrency=1``), so a result depends on the task order as well as on ``seed``.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envace.bench.runner import run_samples
from envace.common.results import read_results
from envace.common.stats import Interval, TaskMatrix, bootstrap_paired_diff
from envace.core.environment import BenchmarkAdapter, Services
from envace.core.fidelity import PairScore, extract_pairs, predict_observations, score_pair
from envace.core.rollout import Mode, RolloutConfig, template_kwargs
from envace.serve.tiny_model import HFGenerateBackend
from envace.train.data import normalize_record

__all__ = ["load_model", "task_success", "reference_fidelity", "by_task", "paired_gain"]


def load_model(model_dir: str | Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a saved HF model folder, on CPU, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: not a saved model folder (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    return model, tokenizer


def task_success(model: torch.nn.Module, tokenizer: Any, adapter: BenchmarkAdapter, *, split: str = "test",
                 samples: int = 4, temperature: float = 0.6, seed: int = 0, enable_thinking: bool = False,
                 max_tokens: int = 64, max_turns: int = 4) -> list[dict[str, Any]]:
    """The result lines of ``samples`` REAL-environment episodes per task of ``split`` (one line per
    (task, sample): ``task_id``, ``sample``, ``score``, ``subscores``, ``status``; no trajectories).

    ``max_tokens``: per ACT generation; ``max_turns``: per episode. The adapter must need no model
    server (its environment runs in-process, as the ledger's does)."""
    tasks = adapter.load_tasks([split], None)
    config = RolloutConfig(mode=Mode.REAL, max_turns=max_turns, max_prompt_tokens=4096,
                           max_response_tokens=4096,
                           act_sampling={"temperature": temperature, "max_tokens": max_tokens},
                           context_budget="episode", turn_cap="every_turn",
                           template_kwargs=template_kwargs(enable_thinking))
    backend = HFGenerateBackend(model, [tokenizer.eos_token_id], seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        path, _ = asyncio.run(run_samples(
            adapter=adapter, tasks=tasks, samples=samples, seed=seed, services=Services(),
            backend_for=lambda task, sample: backend, tokenizer=tokenizer, config=config,
            out=Path(tmp) / "held_out.jsonl",
            manifest={"model": str(getattr(model, "name_or_path", "") or "in-process"), "scale": "smoke",
                      "config_hash": "0" * 16, "git_commit": "", "package_versions": {}},
            progress=False, keep_trajectory=False))
        return read_results(path).lines


def reference_fidelity(model: torch.nn.Module, tokenizer: Any, records: Sequence[Mapping[str, Any]], *,
                       prompt: str = "rehearsal_v2", temperature: float = 0.0, max_tokens: int = 64,
                       seed: int = 0, enable_thinking: bool = False,
                       with_references: bool = False) -> list[PairScore]:
    """One score per (call, observation) pair of the records' reference dialogues (``records``: CM2-shaped,
    with ``uuid``, ``tools`` and ``messages``; e.g. :func:`envace.bench.ledger.reference_record`). The
    REHEARSE prompt ``prompt`` is the training one by default (``rehearsal_v2``).

    ``with_references=False``: the prompt shows no reference response (test-time rehearsal: the world
    model alone). ``True``: it shows the record's reference (call, response) pairs, as training rollouts
    do (:func:`envace.train.data.normalize_record`'s ``references``): the rehearsal the RL trained."""
    pairs, tools, refs = [], [], []
    for index, record in enumerate(records):
        record_pairs, _ = extract_pairs(record["messages"])
        for pair in record_pairs:
            pair.task_id, pair.sample, pair.split = str(record["uuid"]), 0, "reference"
        pairs += record_pairs
        tools += [list(record["tools"])] * len(record_pairs)
        shown = normalize_record(dict(record), index).references if with_references else []
        refs += [shown] * len(record_pairs)
    backend = HFGenerateBackend(model, [tokenizer.eos_token_id], seed=seed)
    predictions = asyncio.run(predict_observations(
        pairs, tools, backend, tokenizer, sampling={"temperature": temperature, "max_tokens": max_tokens},
        prompt_name=prompt, template_kwargs=template_kwargs(enable_thinking), max_context_tokens=4096,
        references=refs))
    return [score_pair(p, pred) for p, pred in zip(pairs, predictions, strict=True)]


def by_task(items: Iterable[tuple[str, float]], *, mean: bool = False) -> dict[str, list[float]]:
    """``{task_id: [value, ...]}`` of ``(task_id, value)`` items in their order (e.g. a result line's
    ``task_id`` and ``score``: one value per sample); ``mean=True``: ``{task_id: [mean value]}`` (e.g. a
    task's pair scores, whose count varies by task)."""
    out: dict[str, list[float]] = {}
    for task_id, value in items:
        out.setdefault(str(task_id), []).append(float(value))
    return {k: [sum(v) / len(v)] for k, v in out.items()} if mean else out


def paired_gain(after: Mapping[str, Sequence[float]], before: Mapping[str, Sequence[float]], *,
                resamples: int = 2000, seed: int = 12345, confidence: float = 0.95) -> Interval:
    """``S(after) - S(before)`` over the tasks both hold, with its paired percentile bootstrap interval.

    Each side is ``{task_id: [one value per sample]}`` (tasks x samples, the same count for every task
    of a side); ``S`` is the mean over tasks of the mean over samples, and the bootstrap draws tasks
    jointly for both sides and samples independently (:func:`envace.common.stats.bootstrap_paired_diff`,
    as the report's Avg@k intervals). Raises ``ValueError`` when they share no task or a side's tasks
    hold different sample counts."""
    ids = sorted(set(after) & set(before))
    if not ids:
        raise ValueError("paired_gain: the two evaluations share no task")

    def matrix(side: str, values: Mapping[str, Sequence[float]]) -> TaskMatrix:
        if len({len(values[t]) for t in ids}) != 1:
            raise ValueError(f"paired_gain: {side}'s tasks hold different sample counts (pass mean=True "
                             "to by_task)")
        rows = np.array([list(values[t]) for t in ids], dtype=float)  # (tasks, samples)
        return TaskMatrix(rows, np.zeros(len(ids), dtype=int), np.ones(1), tuple(ids))

    return bootstrap_paired_diff(matrix("after", after), matrix("before", before), resamples=resamples,
                                 seed=seed, confidence=confidence)
