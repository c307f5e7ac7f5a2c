"""``envace aggregate``: one (model, benchmark) -> Avg@k with a bootstrap interval, as JSON.

Output (values in percent): the benchmark average of the primary metric with its interval, every
metric listed in ``aggregate.metrics`` (e.g. FinMCP's tp/tr/tf1), per-group means and weights, dropped
groups, n_tasks, n_samples, n_failed, seeds, and provenance (header plus each manifest's commit, package
versions, config hash and timestamps). Count metrics say their ``average``; a micro one (the reported
value) carries its ``macro`` counterpart (mean of per-sample values, with its own interval) beside it.
With ``aggregate.method: bfcl_eval`` the summary adds the per-category means, the dropped categories,
``unscored`` categories (live_relevance; with ``aggregate.overall: without_agentic`` the agentic ones too),
``excluded_groups`` (group values that ``aggregate.overall`` weighs into nothing), ``overall_label``
(:attr:`~envace.report.evaluations.Evaluation.overall_label`: ``leaderboard Overall`` or ``re-weighted,
...``) and ``leaderboard_overall``: bfcl-eval's Overall of the same results, in which the excluded groups
are weighted in and the groups that did not run count 0 (our ``value`` re-normalises over the groups it
weighs; a category missing inside a group is left out of it in both, where bfcl-eval counts it 0).
A missing or partial evaluation is an error here (exit 1): this
command runs after the evaluation it summarises.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from envace.bench.bfcl import leaderboard as bfcl
from envace.common.exit_codes import EXIT_UNUSABLE
from envace.common.results import IncompleteResultsError, ResultsError
from envace.report.context import PERCENT, add_common_args, context_from_args, write_output
from envace.report.evaluations import describe_overall


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("aggregate", help="Avg@k with bootstrap CI for one (model, benchmark)")
    add_common_args(p)
    p.add_argument("--model", required=True, help="model id (or TTS setting id with --kind tts)")
    p.add_argument("--benchmark", required=True, help="benchmark id of the config's benchmarks")
    p.add_argument("--kind", choices=["eval", "tts"], default="eval",
                   help="eval: a model's evaluation; tts: a TTS setting's (default: eval)")
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
        weight = {g: w for g, (w, _) in bfcl.LEADERBOARD_GROUPS.items()}
        weighed = sum(weight[g] for g in primary.group_names)
        excluded = sum(weight[g] * v * PERCENT for g, v in primary.excluded_groups.items())
        method.update(
            category_means={c: v * PERCENT for c, v in primary.stratum_means().items()},
            dropped_categories=list(primary.dropped_categories),
            unscored={c: v * PERCENT for c, v in primary.unscored.items()},
            excluded_groups={g: v * PERCENT for g, v in primary.excluded_groups.items()},
            overall_label=primary.overall_label,
            leaderboard_overall=(main["point"] * weighed + excluded) / sum(weight.values()),
            overall_note=(
                f"value = {describe_overall(primary, ctx.cfg['benchmarks'][benchmark]['package'])}; "
                "leaderboard_overall = bfcl-eval's Overall of the same results: every group that ran "
                "weighted in, a group that did not run counted as 0 (a category missing inside a group that "
                "ran is left out of it, where bfcl-eval counts it 0)"
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
        "n_exceptions": primary.n_exceptions,
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
        return EXIT_UNUSABLE
    out = write_output(args.out, json.dumps(summary, indent=2) + "\n")
    print(
        f"aggregate: wrote {out} ({args.model}/{args.benchmark}: {summary['value']:.2f}% "
        f"[{summary['ci_low']:.2f}, {summary['ci_high']:.2f}], {summary['n_tasks']} tasks, "
        f"Avg@{summary['avg_at_k']}, {summary['n_failed']} failed samples, {summary['n_exceptions']} of them "
        "by an exception)"
    )
    return 0
