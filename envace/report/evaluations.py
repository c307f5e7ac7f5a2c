"""Turn the result files of one (model or TTS setting, benchmark) into a :class:`~envace.stats.TaskMatrix`.

For every configured seed (``cfg["seeds"]`` for evaluations, ``cfg["tts"]["seeds"]`` for test-time
scaling) the complete result file is read with the expected config hash
(:func:`envace.config.eval_hash` / :func:`envace.config.tts_hash`). A task's score in a run is the mean
over its samples of the chosen metric (``score`` or a sub-score such as FinMCP's ``tp``); a failed sample
counts as 0 and is counted in ``n_failed``. Tasks map to aggregate groups through their split
(``cfg["benchmarks"][b]["aggregate"]["groups"]``); groups without any task are dropped, the remaining
weights renormalised, and the dropped groups recorded.

Errors: a missing or partial run raises :class:`~envace.results.IncompleteResultsError` (a MISSING cell
in reports); corrupt files, a split outside every group, a missing sub-score, or runs that cover
different tasks raise :class:`~envace.results.ResultsError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from envace.config import eval_hash, tts_hash
from envace.results import ResultsError, eval_path, read_results, tts_path
from envace.stats import TaskMatrix

KINDS = ("eval", "tts")


@dataclass(frozen=True)
class Evaluation:
    """The complete runs of one (model or setting, benchmark, metric) as a task x run matrix."""

    kind: str
    name: str
    benchmark: str
    metric: str
    seeds: tuple[int, ...]
    matrix: TaskMatrix
    group_names: tuple[str, ...]
    dropped_groups: tuple[str, ...]
    n_samples: int
    n_failed: int
    manifests: tuple[dict[str, Any], ...]

    def group_means(self) -> dict[str, float]:
        return dict(zip(self.group_names, self.matrix.group_means().tolist(), strict=True))

    def group_weights(self) -> dict[str, float]:
        return dict(zip(self.group_names, self.matrix.group_weights.tolist(), strict=True))


def _sample_value(line: Mapping[str, Any], metric: str, where: str) -> float:
    if line["status"] == "failed":
        return 0.0
    if metric == "score":
        return float(line["score"])
    if metric not in line["subscores"]:
        raise ResultsError(
            f"{where}: sub-score '{metric}' missing from an ok sample (task {line['task_id']})"
        )
    return float(line["subscores"][metric])


def load_evaluation(
    cfg: Mapping[str, Any],
    results_dir: str | Path,
    kind: str,
    name: str,
    benchmark: str,
    metric: str | None = None,
) -> Evaluation:
    """Read and check every run of ``name`` on ``benchmark`` (see module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    aggregate = cfg["benchmarks"][benchmark]["aggregate"]
    metric = metric or aggregate["metric"]
    split_group = {split: g for g, spec in aggregate["groups"].items() for split in spec["splits"]}
    if kind == "eval":
        seeds, expected, path_of = cfg["seeds"], eval_hash(cfg, name, benchmark), eval_path
    else:
        seeds, expected, path_of = cfg["tts"]["seeds"], tts_hash(cfg, name, benchmark), tts_path
    runs: list[dict[str, list[float]]] = []
    task_split: dict[str, str] = {}
    manifests = []
    n_samples = n_failed = 0
    for seed in seeds:
        res = read_results(path_of(results_dir, name, benchmark, seed), expected_hash=expected)
        m = res.manifest
        if (m["model"], m["benchmark"], m["seed"]) != (name, benchmark, seed):
            raise ResultsError(
                f"{res.path}: manifest is for ({m['model']}, {m['benchmark']}, seed {m['seed']}), "
                f"expected ({name}, {benchmark}, seed {seed})"
            )
        per_task: dict[str, list[float]] = {}
        for i, line in enumerate(res.lines, start=1):
            where = f"{res.path}: line {i}"
            if line["split"] not in split_group:
                raise ResultsError(
                    f"{where}: split '{line['split']}' belongs to no aggregate group of {benchmark}"
                )
            if task_split.setdefault(line["task_id"], line["split"]) != line["split"]:
                raise ResultsError(f"{where}: task {line['task_id']} appears under two splits")
            per_task.setdefault(line["task_id"], []).append(_sample_value(line, metric, where))
            n_failed += line["status"] == "failed"
        n_samples += len(res.lines)
        if runs and per_task.keys() != runs[0].keys():
            differ = sorted(per_task.keys() ^ runs[0].keys())
            raise ResultsError(
                f"{res.path}: covers different tasks than seed {seeds[0]} "
                f"({len(differ)} differ, e.g. {differ[:3]})"
            )
        runs.append(per_task)
        manifests.append(m)
    if not task_split:
        raise ResultsError(f"{name}/{benchmark}: the result files hold no samples")
    groups = list(aggregate["groups"])
    present = [g for g in groups if any(split_group[s] == g for s in task_split.values())]
    tasks = sorted(task_split, key=lambda t: (groups.index(split_group[task_split[t]]), task_split[t], t))
    values = np.array([[np.mean(run[t]) for run in runs] for t in tasks])
    matrix = TaskMatrix(
        values=values,
        group_index=np.array([present.index(split_group[task_split[t]]) for t in tasks]),
        group_weights=np.array([aggregate["groups"][g]["weight"] for g in present], dtype=float),
        task_ids=tuple(tasks),
    )
    return Evaluation(
        kind=kind,
        name=name,
        benchmark=benchmark,
        metric=metric,
        seeds=tuple(seeds),
        matrix=matrix,
        group_names=tuple(present),
        dropped_groups=tuple(g for g in groups if g not in present),
        n_samples=n_samples,
        n_failed=n_failed,
        manifests=tuple(manifests),
    )
