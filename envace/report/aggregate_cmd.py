"""``envace aggregate``: one (model, benchmark) -> Avg@k with a bootstrap interval, as JSON.

Output (values in percent): the benchmark average of the primary metric with its interval, every
metric listed in ``aggregate.metrics`` (e.g. FinMCP's tp/tr/tf1), per-group means and weights, dropped
groups, n_tasks, n_samples, n_failed, seeds, and provenance (header plus each manifest's commit, package
versions, config hash and timestamps). Count metrics say their ``average``; a micro one (the reported
value) carries its ``macro`` counterpart (mean of per-sample values, with its own interval) beside it.
With ``aggregate.method: bfcl_eval`` the summary adds the per-category means, the dropped categories,
``unscored`` categories (live_relevance) and ``leaderboard_overall``: bfcl-eval's Overall, in which the
groups that did not run count 0 (our ``value`` re-normalises over the groups that ran).
A missing or partial evaluation is an error here (exit 1): this
command runs after the evaluation it summarises.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from envace.bench import bfcl
from envace.report.context import PERCENT, add_common_args, context_from_args, write_output
from envace.results import IncompleteResultsError, ResultsError


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("aggregate", help="Avg@k with bootstrap CI for one (model, benchmark)")
    add_common_args(p)
    p.add_argument("--model", required=True, help="model id (or TTS setting id with --kind tts)")
    p.add_argument("--benchmark", required=True)
    p.add_argument("--kind", choices=["eval", "tts"], default="eval")
    p.add_argument("--out", required=True, help="output JSON, e.g. results/summary/MODEL/BENCH.json")
    p.set_defaults(func=run)
    return p


def summarize(ctx: Any, kind: str, name: str, benchmark: str) -> dict[str, Any]:
    """The summary dict written by ``envace aggregate``."""
    aggregate = ctx.cfg["benchmarks"][benchmark]["aggregate"]
    primary = ctx.evaluation(kind, name, benchmark)
    metrics = {}
    for metric in dict.fromkeys([aggregate["metric"], *aggregate.get("metrics", [])]):
        ev = ctx.evaluation(kind, name, benchmark, metric)
        cell = ctx.cell(kind, [(1.0, name)], [benchmark], metric)
        metrics[metric] = {
            **cell.interval.as_dict(),
            "group_means": {g: v * PERCENT for g, v in ev.group_means().items()},
        }
        if ev.average is not None:
            metrics[metric]["average"] = ev.average
        if ev.average == "micro":
            macro = ctx.evaluation(kind, name, benchmark, metric, "macro")
            metrics[metric]["macro"] = {
                **ctx.cell(kind, [(1.0, name)], [benchmark], metric, "macro").interval.as_dict(),
                "group_means": {g: v * PERCENT for g, v in macro.group_means().items()},
            }
    main = metrics[primary.metric]
    method: dict[str, Any] = {"method": primary.method}
    if primary.method == "bfcl_eval":
        ran = sum(bfcl.LEADERBOARD_GROUPS[g][0] for g in primary.group_names)
        total = sum(w for w, _ in bfcl.LEADERBOARD_GROUPS.values())
        method.update(
            category_means={c: v * PERCENT for c, v in primary.stratum_means().items()},
            dropped_categories=list(primary.dropped_categories),
            unscored={c: v * PERCENT for c, v in primary.unscored.items()},
            leaderboard_overall=main["point"] * ran / total,
            overall_note=(
                f"value = weighted mean of the bfcl-eval groups that ran (weights re-normalised over {ran:g} "
                f"of {total:g}); leaderboard_overall counts the others as 0, as bfcl-eval does"
            ),
        )
    return {
        "kind": kind,
        "model": name,
        "benchmark": benchmark,
        "metric": primary.metric,
        "avg_at_k": len(primary.seeds),
        "seeds": list(primary.seeds),
        "value": main["point"],
        "ci_low": main["ci_low"],
        "ci_high": main["ci_high"],
        "degenerate": main["degenerate"],
        "group_means": main["group_means"],
        "group_weights": primary.group_weights(),
        "dropped_groups": list(primary.dropped_groups),
        **method,
        "metrics": metrics,
        "n_tasks": primary.matrix.n_tasks,
        "n_samples": primary.n_samples,
        "n_failed": primary.n_failed,
        "n_failed_uncounted": primary.n_failed_uncounted,
        "units": "percent",
        "provenance": {
            **ctx.header(),
            "manifests": [
                {
                    k: m[k]
                    for k in ("seed", "git_commit", "config_hash", "package_versions", "started", "finished")
                }
                for m in primary.manifests
            ],
        },
    }


def run(args: argparse.Namespace) -> int:
    try:
        ctx = context_from_args(args)
        summary = summarize(ctx, args.kind, args.model, args.benchmark)
    except IncompleteResultsError as exc:
        print(f"envace aggregate: evaluation incomplete: {exc}", file=sys.stderr)
        return 1
    except ResultsError as exc:
        print(f"envace aggregate: {exc}", file=sys.stderr)
        return 2
    out = write_output(args.out, json.dumps(summary, indent=2) + "\n")
    print(
        f"aggregate: wrote {out} ({args.model}/{args.benchmark}: {summary['value']:.2f}% "
        f"[{summary['ci_low']:.2f}, {summary['ci_high']:.2f}], {summary['n_tasks']} tasks, "
        f"Avg@{summary['avg_at_k']}, {summary['n_failed']} failed samples)"
    )
    return 0
