"""Turn the result files of one (model or TTS setting, benchmark) into a bootstrap statistic of
:mod:`envace.common.stats` (a :class:`~envace.common.stats.TaskMatrix`, or a
:class:`~envace.common.stats.RatioMatrix` for
micro-averaged count metrics).

For every configured seed (``cfg["seeds"]`` for evaluations unless the caller names others, e.g. the
learning check's :func:`envace.common.config.learning_seeds`; ``cfg["tts"]["seeds"]`` for test-time
scaling) the complete result file is read with the expected config hash
(:func:`envace.common.config.eval_hash` / :func:`envace.common.config.tts_hash`).

Per-task values. A task's value in a run is the mean over its samples of the chosen metric (``score`` or
a sub-score such as FinMCP's ``tp``); a failed sample counts as 0 and is counted in ``n_failed`` (those
ended by an exception, not by the model, also in ``n_exceptions``).
Count metrics (FinMCP's tp / tr / tf1 / score, :data:`envace.bench.finmcp.MICRO_METRICS`) with
``aggregate.average: micro`` (the default) instead keep, per task and run, the mean over its samples of
the metric's numerator and denominator counts (from each line's ``extra`` ``TP`` / ``FP`` / ``FN``); the
statistic is their ratio, i.e. with one group the metric of the counts summed over every sample of every
run. A failed sample contributes TP = FP = 0 and FN = its gold tool count (TP + FN as recorded); one
without recorded counts contributes nothing and is counted in ``n_failed_uncounted``. With
``average: macro`` they are per-sample means like any sub-score.

Groups. ``aggregate.method: pooled`` (the default): tasks map to the config's aggregate groups through
their split; a group's value is the mean over its tasks; groups are the bootstrap strata. ``method:
bfcl_eval`` (BFCL-v4): the strata are the categories (splits) and group values and weights are those of
the pinned bfcl-eval leaderboard (:func:`envace.bench.bfcl.leaderboard.leaderboard_weights`; the config's
``groups``
are not used); ``live_relevance`` is reported in ``unscored`` and weighted into nothing. ``aggregate.overall``
(``bfcl_eval`` only; :data:`OVERALLS`): ``leaderboard`` (default) weighs all five leaderboard groups,
agentic included; ``without_agentic`` reports the agentic categories in ``unscored`` too (and the agentic
group value in ``excluded_groups``) but weighs them into nothing. In both methods, groups (and, for
``bfcl_eval``, categories) without any task are dropped, the remaining weights renormalised, and the
dropped ones recorded. :attr:`Evaluation.overall_label` says which Overall a ``bfcl_eval`` value is.

Errors: a missing or partial run raises :class:`~envace.common.results.IncompleteResultsError` (a MISSING cell
in reports); corrupt files, a split outside every group, a missing sub-score or count, or runs that
cover different tasks raise :class:`~envace.common.results.ResultsError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from envace.bench import finmcp
from envace.bench.bfcl import leaderboard as bfcl
from envace.common.config import eval_hash, tts_hash
from envace.common.results import ResultsError, eval_path, read_results, tts_path
from envace.common.stats import RatioMatrix, Statistic, TaskMatrix
from envace.core.episode import is_exception_result

KINDS = ("eval", "tts")
METHODS = ("pooled", "bfcl_eval")
#: ``aggregate.overall`` (``method: bfcl_eval`` only) -> the leaderboard groups it weighs into nothing.
OVERALLS: dict[str, tuple[str, ...]] = {"leaderboard": (), "without_agentic": ("agentic",)}
LEADERBOARD_OVERALL = "leaderboard Overall"
AVERAGES = ("micro", "macro")
#: benchmark -> its count metrics (metric -> numerator / denominator count coefficients).
COUNT_METRICS: dict[str, dict[str, tuple[dict[str, float], dict[str, float]]]] = {
    "finmcp": finmcp.MICRO_METRICS,
}


@dataclass(frozen=True)
class Evaluation:
    """The complete runs of one (model or setting, benchmark, metric) as a bootstrap statistic.

    ``group_names`` are the reported groups; ``strata`` the bootstrap strata (the statistic's groups) when
    they differ (``method: bfcl_eval``: categories), with ``group_map[g, s]`` the weight of stratum ``s``
    in group ``g``'s value and ``reported_weights`` the groups' Overall weights. ``average`` is ``micro``
    or ``macro`` for count metrics, ``None`` otherwise. ``method: bfcl_eval``: ``dropped_groups`` /
    ``dropped_categories`` are the leaderboard groups / categories without any task; ``unscored`` maps each
    category that ran but is weighted into nothing to its value; ``excluded_groups`` maps each leaderboard
    group that ran but that ``aggregate.overall`` weighs into nothing to its bfcl-eval group value (over
    its categories that ran, which are in ``unscored``).
    """

    kind: str
    name: str
    benchmark: str
    metric: str
    seeds: tuple[int, ...]
    matrix: Statistic
    group_names: tuple[str, ...]
    dropped_groups: tuple[str, ...]
    n_samples: int
    n_failed: int
    manifests: tuple[dict[str, Any], ...]
    method: str = "pooled"
    average: str | None = None
    strata: tuple[str, ...] = ()
    group_map: np.ndarray | None = None
    reported_weights: tuple[float, ...] = ()
    dropped_categories: tuple[str, ...] = ()
    unscored: dict[str, float] = field(default_factory=dict)
    excluded_groups: dict[str, float] = field(default_factory=dict)
    n_failed_uncounted: int = 0
    n_exceptions: int = 0  # of n_failed: ended by an exception, not by the model (extra.exception)

    def group_means(self) -> dict[str, float]:
        means = self.matrix.group_means()
        if self.group_map is not None:
            means = self.group_map @ means
        return dict(zip(self.group_names, means.tolist(), strict=True))

    def group_weights(self) -> dict[str, float]:
        if self.group_map is not None:
            return dict(zip(self.group_names, self.reported_weights, strict=True))
        return dict(zip(self.group_names, self.matrix.group_weights.tolist(), strict=True))

    def stratum_means(self) -> dict[str, float]:
        """Per-stratum values (``method: bfcl_eval``: per-category accuracies); ``{}`` for ``pooled``."""
        if not self.strata:
            return {}
        return dict(zip(self.strata, self.matrix.group_means().tolist(), strict=True))

    @property
    def overall_label(self) -> str | None:
        """Which Overall the value of a ``method: bfcl_eval`` evaluation is, from what ran and is weighted.

        :data:`LEADERBOARD_OVERALL` (``"leaderboard Overall"``) when every group and category of
        :data:`envace.bench.bfcl.leaderboard.LEADERBOARD_GROUPS` ran and is weighted in: bfcl-eval's Overall.
        Otherwise
        ``"re-weighted, without <groups>"`` naming the leaderboard groups not weighted in (did not run, or
        excluded by ``aggregate.overall``), and/or ``"missing categories in <groups>"`` naming the weighted
        groups with a category that did not run, joined by ``"; "`` (groups in leaderboard order, e.g.
        ``"re-weighted, without live, agentic; missing categories in non_live"``). ``None`` for ``pooled``.
        """
        if self.method != "bfcl_eval":
            return None
        tree = bfcl.LEADERBOARD_GROUPS
        without = [g for g in tree if g not in self.group_names]
        partial = [g for g in self.group_names if set(_leaves(tree[g][1])) & set(self.dropped_categories)]
        parts = ([f"without {', '.join(without)}"] if without else []) + (
            [f"missing categories in {', '.join(partial)}"] if partial else []
        )
        return f"re-weighted, {'; '.join(parts)}" if parts else LEADERBOARD_OVERALL


def describe_overall(ev: Evaluation, package: str) -> str:
    """``"<overall_label> (<package>: <weighted groups> = <their bfcl-eval Overall weights>)"``, with
    ``", re-normalised"`` before the closing parenthesis unless the label is the leaderboard Overall; e.g.
    ``"leaderboard Overall (bfcl-eval 2026.3.23: non-live/live/irrelevance/multi-turn/agentic =
    10/10/10/30/40)"``. ``package`` is the config's pin (``bfcl-eval==2026.3.23``). ``method: bfcl_eval``
    only."""
    label = ev.overall_label
    if label is None:
        raise ValueError(f"{ev.name}/{ev.benchmark}: only a method bfcl_eval evaluation has an Overall label")
    names = "/".join(g.replace("_", "-") for g in ev.group_names)
    weights = "/".join(f"{bfcl.LEADERBOARD_GROUPS[g][0]:g}" for g in ev.group_names)
    renorm = "" if label == LEADERBOARD_OVERALL else ", re-normalised"
    return f"{label} ({package.replace('==', ' ')}: {names} = {weights}{renorm})"


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


def _sample_counts(
    line: Mapping[str, Any], ratio: tuple[dict[str, float], dict[str, float]], where: str
) -> tuple[float, float] | None:
    """``(numerator, denominator)`` of a count metric for one line; ``None`` for a failed line without
    counts (see the module docstring)."""
    extra = line.get("extra") or {}
    have = all(isinstance(extra.get(k), int | float) and extra[k] >= 0 for k in finmcp.COUNT_KEYS)
    if line["status"] == "failed":
        if not have:
            return None
        counts = {"TP": 0.0, "FP": 0.0, "FN": float(extra["TP"] + extra["FN"])}
    elif not have:
        raise ResultsError(
            f"{where}: micro average needs the counts extra.{'/'.join(finmcp.COUNT_KEYS)} of every ok "
            f"sample (task {line['task_id']}); rerun the evaluation or set aggregate.average: macro"
        )
    else:
        counts = {k: float(extra[k]) for k in finmcp.COUNT_KEYS}
    num, den = ratio
    return sum(c * counts[k] for k, c in num.items()), sum(c * counts[k] for k, c in den.items())


def _leaves(node: bfcl.AggNode) -> list[str]:
    return [x for c in node.children for x in (_leaves(c) if isinstance(c, bfcl.AggNode) else [c])]


def load_evaluation(
    cfg: Mapping[str, Any],
    results_dir: str | Path,
    kind: str,
    name: str,
    benchmark: str,
    metric: str | None = None,
    average: str | None = None,
    seeds: Sequence[int] | None = None,
) -> Evaluation:
    """Read and check every run of ``name`` on ``benchmark`` (see module docstring).

    ``average`` overrides ``aggregate.average`` (``micro`` / ``macro``; only count metrics use it);
    ``seeds`` the evaluation seeds read (``kind`` eval only; default ``cfg["seeds"]``).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    aggregate = cfg["benchmarks"][benchmark]["aggregate"]
    metric = metric or aggregate["metric"]
    method = aggregate.get("method", "pooled")
    if method not in METHODS:
        raise ValueError(f"aggregate.method must be one of {METHODS}, got {method!r}")
    overall = aggregate.get("overall", "leaderboard")  # the schema's default fills it in for every benchmark
    if overall != "leaderboard" and method != "bfcl_eval":
        raise ValueError(
            f"benchmarks.{benchmark}.aggregate.overall: {overall} is only meaningful with aggregate.method: "
            f"bfcl_eval (got method {method!r})"
        )
    if overall not in OVERALLS:
        raise ValueError(
            f"benchmarks.{benchmark}.aggregate.overall must be one of {tuple(OVERALLS)}, got {overall!r}"
        )
    ratio = COUNT_METRICS.get(benchmark, {}).get(metric)
    if ratio is None:
        average = None
    else:
        average = average or aggregate.get("average", "micro")
        if average not in AVERAGES:
            raise ValueError(f"aggregate.average must be one of {AVERAGES}, got {average!r}")
        if average == "macro":
            ratio = None
    tree = bfcl.LEADERBOARD_GROUPS
    excluded = OVERALLS[overall]
    if method == "bfcl_eval":
        split_group = {c: c for _, node in tree.values() for c in _leaves(node)}
        split_group.update({s: s for s in bfcl.UNSCORED_SPLITS})
    else:
        split_group = {split: g for g, spec in aggregate["groups"].items() for split in spec["splits"]}
    if kind == "eval":
        seeds, expected, path_of = list(seeds or cfg["seeds"]), eval_hash(cfg, name, benchmark), eval_path
    else:
        if seeds is not None:
            raise ValueError("seeds: only evaluations (kind 'eval') read other seeds than the config's")
        seeds, expected, path_of = cfg["tts"]["seeds"], tts_hash(cfg, name, benchmark), tts_path
    runs: list[dict[str, list[Any]]] = []
    task_split: dict[str, str] = {}
    manifests = []
    n_samples = n_failed = n_uncounted = n_exceptions = 0
    for seed in seeds:
        res = read_results(path_of(results_dir, name, benchmark, seed), expected_hash=expected)
        m = res.manifest
        if (m["model"], m["benchmark"], m["seed"]) != (name, benchmark, seed):
            raise ResultsError(
                f"{res.path}: manifest is for ({m['model']}, {m['benchmark']}, seed {m['seed']}), "
                f"expected ({name}, {benchmark}, seed {seed})"
            )
        per_task: dict[str, list[Any]] = {}
        for i, line in enumerate(res.lines, start=1):
            where = f"{res.path}: line {i}"
            if line["split"] not in split_group:
                what = "bfcl-eval leaderboard category" if method == "bfcl_eval" else "aggregate group"
                raise ResultsError(f"{where}: split '{line['split']}' belongs to no {what} of {benchmark}")
            if task_split.setdefault(line["task_id"], line["split"]) != line["split"]:
                raise ResultsError(f"{where}: task {line['task_id']} appears under two splits")
            if ratio is None:
                value: Any = _sample_value(line, metric, where)
            else:
                value = _sample_counts(line, ratio, where)
                if value is None:
                    n_uncounted += 1
                    value = (0.0, 0.0)
            per_task.setdefault(line["task_id"], []).append(value)
            n_failed += line["status"] == "failed"
            n_exceptions += is_exception_result(line)
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

    def task_values(tasks: list[str]) -> np.ndarray:
        """tasks x runs (x 2 for a count metric: numerator, denominator) of per-task sample means."""
        return np.array([[np.mean(run[t], axis=0) for run in runs] for t in tasks], dtype=float)

    extra: dict[str, Any] = {}
    if method == "bfcl_eval":
        order = list(split_group)
        unscored_splits = [*bfcl.UNSCORED_SPLITS, *(c for g in excluded for c in _leaves(tree[g][1]))]
        unscored: dict[str, float] = {}
        for split in unscored_splits:
            vals = task_values([t for t, s in task_split.items() if s == split])
            if vals.size:
                num, den = (vals[..., 0].sum(), vals[..., 1].sum()) if ratio else (vals.mean(), 1.0)
                unscored[split] = float(num / den) if den > 0 else 0.0
        counts = {s: sum(v == s for v in task_split.values()) for s in set(task_split.values())}
        ran = bfcl.leaderboard_weights(counts)  # every leaderboard group, the excluded ones included
        task_split = {t: s for t, s in task_split.items() if s not in unscored_splits}
        if not task_split:
            raise ResultsError(f"{name}/{benchmark}: no task in a weighted bfcl-eval leaderboard group")
        lw = bfcl.leaderboard_weights(counts, {g: spec for g, spec in tree.items() if g not in excluded})
        weights = lw.category_weights()
        present = [s for s in order if s in weights]
        groups = list(lw.within)
        total = sum(lw.group_weights.values())
        extra.update(
            strata=tuple(present),
            group_map=np.array([[lw.within[g].get(s, 0.0) for s in present] for g in groups]),
            reported_weights=tuple(lw.group_weights[g] / total for g in groups),
            dropped_categories=ran.dropped_categories,
            unscored=unscored,
            excluded_groups={g: sum(w * unscored[c] for c, w in ran.within[g].items())
                             for g in excluded if g in ran.within},
        )
        stratum_of = dict(task_split)
        stratum_weight = [weights[s] for s in present]
        group_names, dropped = tuple(groups), ran.dropped_groups
    else:
        config_groups = list(aggregate["groups"])
        present = [g for g in config_groups if any(split_group[s] == g for s in task_split.values())]
        stratum_of = {t: split_group[s] for t, s in task_split.items()}
        stratum_weight = [aggregate["groups"][g]["weight"] for g in present]
        group_names, dropped = tuple(present), tuple(g for g in config_groups if g not in present)
    tasks = sorted(task_split, key=lambda t: (present.index(stratum_of[t]), task_split[t], t))
    values = task_values(tasks)
    build = {
        "group_index": np.array([present.index(stratum_of[t]) for t in tasks]),
        "group_weights": np.array(stratum_weight, dtype=float),
        "task_ids": tuple(tasks),
    }
    matrix: Statistic
    if ratio is None:
        matrix = TaskMatrix(values=values, **build)
    else:
        matrix = RatioMatrix(
            TaskMatrix(values=values[..., 0], **build), TaskMatrix(values=values[..., 1], **build)
        )
    return Evaluation(
        kind=kind,
        name=name,
        benchmark=benchmark,
        metric=metric,
        seeds=tuple(seeds),
        matrix=matrix,
        group_names=group_names,
        dropped_groups=dropped,
        n_samples=n_samples,
        n_failed=n_failed,
        manifests=tuple(manifests),
        method=method,
        average=average,
        n_failed_uncounted=n_uncounted,
        n_exceptions=n_exceptions,
        **extra,
    )
