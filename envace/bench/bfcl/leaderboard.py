"""BFCL-v4 leaderboard aggregation.

- Leaderboard aggregation (:data:`LEADERBOARD_GROUPS`, :func:`leaderboard_weights`,
  :func:`leaderboard_scores`): our implementation of the pinned ``generate_leaderboard_csv`` group
  formulas — Non-live = unweighted mean of (unweighted mean of simple_python/java/javascript), multiple,
  parallel, parallel_multiple; Live = task-count-weighted mean of the four live AST categories;
  Irrelevance = unweighted mean of irrelevance and live_irrelevance; Multi turn = unweighted mean of its
  four categories; Agentic = unweighted mean of (web search mean, memory mean); Overall = 10/10/10/30/40;
  live_relevance is reported but in no group. Where bfcl-eval counts a category or group that did not
  run as 0, we leave it out and re-normalise (the reported value is labelled so; ``overall_leaderboard``
  gives bfcl-eval's zero-filled Overall). The report uses it with config
  ``benchmarks.bfcl_v4.aggregate.method: bfcl_eval``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from envace.bench.bfcl.common import MULTI_TURN_SPLITS

# --- Leaderboard aggregation --------------------------------------------------------------------------
# Our own implementation of the group formulas of the pinned bfcl-eval 2026.3.23
# (``bfcl_eval/eval_checker/eval_runner_helper.py``, ``generate_leaderboard_csv``); the test
# ``tests/bench/bfcl/test_metric_rules.py`` checks it against that function. Used by the report when
# ``benchmarks.bfcl_v4.aggregate.method`` is ``bfcl_eval`` (envace.report.evaluations).


@dataclass(frozen=True)
class AggNode:
    """One aggregation step: ``mean`` = unweighted mean of the children's values (bfcl-eval
    ``calculate_unweighted_accuracy``); ``count`` = mean of the children's values weighted by their task
    counts (``calculate_weighted_accuracy``). A child is a category (split) name or another node."""

    rule: Literal["mean", "count"]
    children: tuple[str | AggNode, ...]


#: bfcl-eval's Overall groups: name -> (Overall weight, how the group value is computed from categories).
#: ``live_relevance`` is in none of them (bfcl-eval reports it as "Relevance Detection", outside Overall).
LEADERBOARD_GROUPS: dict[str, tuple[float, AggNode]] = {
    "non_live": (10.0, AggNode("mean", (
        AggNode("mean", ("simple_python", "simple_java", "simple_javascript")),
        "multiple", "parallel", "parallel_multiple"))),
    "live": (10.0, AggNode("count", (
        "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"))),
    "irrelevance": (10.0, AggNode("mean", ("irrelevance", "live_irrelevance"))),
    "multi_turn": (30.0, AggNode("mean", MULTI_TURN_SPLITS)),
    "agentic": (40.0, AggNode("mean", (
        AggNode("mean", ("web_search_base", "web_search_no_snippet")),
        AggNode("mean", ("memory_kv", "memory_vector", "memory_rec_sum"))))),
}
#: Categories bfcl-eval reports but weights into no Overall group.
UNSCORED_SPLITS = ("live_relevance",)


def _node_weights(node: AggNode, counts: Mapping[str, float]) -> dict[str, float]:
    """Weight of each present category in ``node``'s value (summing to 1); ``{}`` if none is present.

    A child without any present category is left out and the remaining children share the node's value
    (unweighted or by their summed task counts): the re-normalisation over what ran.
    """
    parts: list[tuple[float, dict[str, float]]] = []
    for child in node.children:
        if isinstance(child, AggNode):
            inner = _node_weights(child, counts)
            if inner:
                parts.append((sum(counts[c] for c in inner), inner))
        elif counts.get(child, 0) > 0:
            parts.append((float(counts[child]), {child: 1.0}))
    if not parts:
        return {}
    shares = [1.0 / len(parts)] * len(parts) if node.rule == "mean" else [n / sum(n for n, _ in parts)
                                                                            for n, _ in parts]
    return {c: share * w for share, (_, inner) in zip(shares, parts, strict=True) for c, w in inner.items()}


@dataclass(frozen=True)
class LeaderboardWeights:
    """The bfcl-eval aggregation restricted to the categories that ran.

    ``within[g][c]``: weight of category ``c`` in group ``g``'s value (sums to 1 per group);
    ``group_weights``: Overall weights of the groups that ran (raw, e.g. 10/10/10/30);
    ``dropped_groups`` / ``dropped_categories``: leaderboard groups / categories without any task.
    """

    within: dict[str, dict[str, float]]
    group_weights: dict[str, float]
    dropped_groups: tuple[str, ...]
    dropped_categories: tuple[str, ...]

    def category_weights(self) -> dict[str, float]:
        """Weight of each category in the re-normalised Overall (sums to 1)."""
        total = sum(self.group_weights.values())
        return {c: self.group_weights[g] / total * w
                for g, inner in self.within.items() for c, w in inner.items()}


def leaderboard_weights(counts: Mapping[str, float],
                        groups: Mapping[str, tuple[float, AggNode]] | None = None) -> LeaderboardWeights:
    """Weights of :data:`LEADERBOARD_GROUPS` (or ``groups``) for the categories with ``counts[c] > 0``
    tasks (see :func:`_node_weights` for categories and groups that did not run)."""
    groups = LEADERBOARD_GROUPS if groups is None else groups
    within, weights = {}, {}
    for name, (weight, node) in groups.items():
        inner = _node_weights(node, counts)
        if inner:
            within[name], weights[name] = inner, float(weight)

    def leaves(node: AggNode) -> list[str]:
        return [x for c in node.children for x in (leaves(c) if isinstance(c, AggNode) else [c])]

    every = [c for _, node in groups.values() for c in leaves(node)]
    return LeaderboardWeights(within, weights, tuple(g for g in groups if g not in within),
                              tuple(c for c in every if counts.get(c, 0) <= 0))


def leaderboard_scores(accuracy: Mapping[str, float], counts: Mapping[str, float]) -> dict[str, float]:
    """Group values and Overall from per-category accuracies and task counts (categories absent from
    ``accuracy`` did not run).

    ``overall``: weighted mean of the groups that ran, weights re-normalised (our reported value);
    ``overall_leaderboard``: bfcl-eval's Overall, where a group that did not run counts as 0 with its
    weight (so ``overall_leaderboard = overall * sum(weights that ran) / 100``).
    """
    lw = leaderboard_weights({c: n for c, n in counts.items() if c in accuracy})
    out = {g: sum(w * accuracy[c] for c, w in inner.items()) for g, inner in lw.within.items()}
    ran = sum(lw.group_weights.values())
    out["overall"] = sum(lw.group_weights[g] * out[g] for g in lw.within) / ran if ran else 0.0
    total = sum(w for w, _ in LEADERBOARD_GROUPS.values())
    out["overall_leaderboard"] = out["overall"] * ran / total
    return out
