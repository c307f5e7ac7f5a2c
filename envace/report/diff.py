"""``envace diff``: every paper cell and claim against our results, as Markdown and JSON.

Entries: one per cell of ``paper_numbers.yaml`` (Tables 1-3 and the Figure 3/4/5 points, null paper values
included), ``{"table", "row", "column", "paper", "ours", "ci_low", "ci_high", "delta", "status", "note"}``
in percent, where status is

* ``EXACT``: |ours - paper| <= half a unit of the paper's printed precision;
* ``WITHIN_CI``: the paper's value lies in our interval; ``OUTSIDE_CI``: it does not;
* ``MISSING``: our evaluation is absent or partial (``note`` says which); ``NO_PAPER_VALUE``: we have a
  value, the paper's is null.

Claims (``paper_numbers.yaml`` ``claims``) are checked as described in ``paper_tables/claims.yaml``, with
paired bootstrap intervals, and get SUPPORTED / REFUTED / INCONCLUSIVE / MISSING; the evaluation and TTS
claims (:data:`ON_OURS`) are checked again on each ``evaluation.ours_benchmarks`` entry alone (ids
``<claim>@<benchmark>``, texts marked ours). Exit status: 0, or 1
with ``--strict`` when any cell is OUTSIDE_CI or any claim REFUTED, 2 for corrupt or stale results.

With ``released`` in the config the diff adds the authors' released weights through our evaluators
(:func:`released_results`, the released-weights view of :class:`envace.report.context.ReleasedView`): the
Table 1-2 rows of each replaced model and, when the TTS actor has a released checkpoint, Table 3, each
cell with the paper's value, the released weights' with its interval and status, and ours (trained)
beside it; and every claim again in that view. ``--released-only`` writes only that section
(``released_diff.{md,json}``; target ``released``: no training job, so the trained ours column is left
out).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from envace.common.config import learning_seeds, ours_benchmarks, released_models
from envace.common.exit_codes import EXIT_UNUSABLE
from envace.common.results import ResultsError, diff_paths
from envace.report import points
from envace.report.context import (
    Cell,
    ReleasedView,
    ReportContext,
    add_common_args,
    context_from_args,
    write_output,
)
from envace.report.formatting import bounds, number, signed
from envace.report.paper import decimals, load_claims
from envace.report.tables import BUILDERS

Comparison = tuple[str, Cell]


def cell_status(paper: float | None, cell: Cell | None, dec: int) -> str:
    if cell is None or not cell.ok:
        return "MISSING"
    if paper is None:
        return "NO_PAPER_VALUE"
    iv = cell.interval
    if abs(iv.point - paper) <= 0.5 * 10.0**-dec + 1e-9:
        return "EXACT"
    return "WITHIN_CI" if iv.low <= paper <= iv.high else "OUTSIDE_CI"


def make_entry(table: str, row: str, column: str, paper: float | None, cell: Cell | None, dec: int) -> dict:
    iv = cell.interval if cell is not None else None
    note = "; ".join(cell.missing) if cell is not None and not cell.ok else ""
    return {
        "table": table,
        "row": row,
        "column": column,
        "paper": paper,
        "ours": iv.point if iv else None,
        "ci_low": iv.low if iv else None,
        "ci_high": iv.high if iv else None,
        "degenerate": iv.degenerate if iv else None,
        "delta": iv.point - paper if iv and paper is not None else None,
        "decimals": dec,
        "status": cell_status(paper, cell, dec),
        "note": note,
    }


def table_entries(ctx: ReportContext) -> list[dict]:
    entries = []
    for name, build in BUILDERS.items():
        section = ctx.paper[name]
        ours = {row.key if name == "table3" else row.label: row for row in build(ctx).rows}
        for label, values in section["rows"].items():
            row = ours.get(label)
            for col in section["columns"]:
                cell = row.cells.get(col) if row else Cell(None, ("row not produced by this config",))
                entries.append(
                    make_entry(name, label, col, values.get(col), cell, decimals(ctx.paper, name, col))
                )
    return entries


def figure_entries(ctx: ReportContext) -> list[dict]:
    paper = ctx.paper
    entries = []
    fig3 = points.figure3(ctx)
    for point, value in paper["figure3"]["points"].items():
        cell = fig3.get(point, Cell(None, (f"report.fig3 has no '{point}'",)))
        entries.append(
            make_entry("figure3", point, points.FIG3_BENCHMARK, value, cell, decimals(paper, "figure3", ""))
        )
    fig4 = points.figure4(ctx)
    for method, sizes in paper["figure4"]["points"].items():
        for size, values in sizes.items():
            for bench, value in values.items():
                cell = (
                    fig4.get(method, {})
                    .get(size, {})
                    .get(bench, Cell(None, (f"report.fig4 has no {method}/{size}",)))
                )
                entries.append(
                    make_entry(
                        "figure4", f"{method} {size}", bench, value, cell, decimals(paper, "figure4", bench)
                    )
                )
    fig5 = points.figure5(ctx)
    bench = ctx.cfg["evaluation"]["checkpoints"]["benchmark"]
    for step, value in paper["figure5"]["points"].items():
        cell = fig5.get(int(step), Cell(None, (f"step {step} not in evaluation.checkpoints.steps",)))
        entries.append(
            make_entry("figure5", f"step {step}", bench, value, cell, decimals(paper, "figure5", ""))
        )
    return entries


def verdict(should_be_positive: Sequence[Cell], must_not_be_positive: Sequence[Cell] = ()) -> str:
    """SUPPORTED / REFUTED / INCONCLUSIVE / MISSING from paired-difference intervals (see claims.yaml)."""
    cells = [*should_be_positive, *must_not_be_positive]
    if not cells or any(not c.ok for c in cells):
        return "MISSING"
    if any(c.interval.high < 0 for c in should_be_positive) or any(
        c.interval.low > 0 for c in must_not_be_positive
    ):
        return "REFUTED"
    if all(c.interval.low > 0 for c in should_be_positive):
        return "SUPPORTED"
    return "INCONCLUSIVE"


def _eval_diff(ctx: ReportContext, a: str, b: str, benches: Sequence[str]) -> Comparison:
    return f"{a} - {b} on {'+'.join(benches)}", ctx.cell("eval", [(1.0, a), (-1.0, b)], benches)


def _tts_diff(ctx: ReportContext, a: str, b: str, on: Sequence[str] | None = None) -> Comparison:
    """``a - b`` on the TTS Overall (mean of ``tts.benchmarks``) or, given ``on``, on those benchmarks."""
    benches = list(on) if on else ctx.cfg["tts"]["benchmarks"]
    where = "+".join(benches) if on else "TTS Overall"
    return f"{a} - {b} on {where}", ctx.cell("tts", [(1.0, a), (-1.0, b)], benches)


Check = Callable[[ReportContext, dict, Sequence[str] | None], tuple[str, list[Comparison]]]


def claim_envace_best_overall(ctx: ReportContext, spec: dict, on: Sequence[str] | None = None
                              ) -> tuple[str, list[Comparison]]:
    by_label = {m["label"]: mid for mid, m in ctx.cfg["models"].items()}
    benches = on or ctx.cfg["evaluation"]["table1"]["benchmarks"]
    subject = by_label.get(spec["subject"])
    if subject is None or not ctx.mean("eval", subject, benches).ok:
        return "MISSING", []
    complete = [
        by_label[b] for b in spec["baselines"] if b in by_label and ctx.mean("eval", by_label[b], benches).ok
    ]
    comps = [_eval_diff(ctx, subject, base, benches) for base in complete]
    return verdict([c for _, c in comps]), comps


def claim_rehearsal_beats_grpo(ctx: ReportContext, spec: dict, on: Sequence[str] | None = None
                               ) -> tuple[str, list[Comparison]]:
    fig3 = ctx.cfg["report"]["fig3"]
    comps = [_eval_diff(ctx, fig3["envace_shared"], fig3["grpo"], on or [points.FIG3_BENCHMARK])]
    return verdict([comps[0][1]]), comps


def claim_shared_beats_per_role(ctx: ReportContext, spec: dict, on: Sequence[str] | None = None
                                ) -> tuple[str, list[Comparison]]:
    fig3 = ctx.cfg["report"]["fig3"]
    comps = [_eval_diff(ctx, fig3["envace_shared"], fig3["per_role_policy"], on or [points.FIG3_BENCHMARK])]
    return verdict([comps[0][1]]), comps


def claim_gain_at_both_scales(ctx: ReportContext, spec: dict, on: Sequence[str] | None = None
                              ) -> tuple[str, list[Comparison]]:
    fig4 = ctx.cfg["report"]["fig4"]
    sizes = list(fig4["envace"])
    benches = list(on or points.FIG4_BENCHMARKS)
    comps = [_eval_diff(ctx, fig4["envace"][s], fig4["grpo"][s], benches) for s in sizes]
    small, large = sizes[0], sizes[-1]
    terms = [
        (1.0, fig4["envace"][large]),
        (-1.0, fig4["grpo"][large]),
        (-1.0, fig4["envace"][small]),
        (1.0, fig4["grpo"][small]),
    ]
    comps.append(
        (f"gain at {large} - gain at {small} on {'+'.join(benches)}", ctx.cell("eval", terms, benches))
    )
    return verdict([c for _, c in comps]), comps


def claim_parallel_tts_helps(ctx: ReportContext, spec: dict, on: Sequence[str] | None = None
                             ) -> tuple[str, list[Comparison]]:
    t3 = ctx.cfg["tts"]["table3"]
    helps = _tts_diff(ctx, t3["parallel_envace"], t3["no_tts"], on)
    base = _tts_diff(ctx, t3["parallel_base"], t3["no_tts"], on)
    return verdict([helps[1]], [base[1]]), [helps, base]


def claim_tts_n3_worse(ctx: ReportContext, spec: dict, on: Sequence[str] | None = None
                       ) -> tuple[str, list[Comparison]]:
    tts = ctx.cfg["tts"]
    if not {2, 3} <= set(tts["n"]) or "envace" not in tts["rehearsers"]:
        return "MISSING", []
    comps = [_tts_diff(ctx, f"{m}_n2_envace", f"{m}_n3_envace", on) for m in tts["modes"]]
    return verdict([c for _, c in comps]), comps


CLAIMS: dict[str, Check] = {
    "envace_best_overall": claim_envace_best_overall,
    "rehearsal_beats_grpo": claim_rehearsal_beats_grpo,
    "shared_beats_per_role": claim_shared_beats_per_role,
    "gain_at_both_scales": claim_gain_at_both_scales,
    "parallel_tts_helps": claim_parallel_tts_helps,
    "tts_n3_worse": claim_tts_n3_worse,
}


#: The claims checked again on each of ``evaluation.ours_benchmarks`` alone: those comparing evaluations
#: (Table 1, Figures 3-4) and the TTS ones (Table 3, Figure 6: every TTS setting runs on ours too).
ON_OURS = ("envace_best_overall", "rehearsal_beats_grpo", "shared_beats_per_role", "gain_at_both_scales",
           "parallel_tts_helps", "tts_n3_worse")


def claim_results(ctx: ReportContext) -> list[dict]:
    """Each paper claim checked as ``claims.yaml`` says, then each :data:`ON_OURS` claim again on each of
    ``evaluation.ours_benchmarks`` alone (id ``<claim>@<benchmark>``; ours, not the paper's test)."""
    specs = load_claims(ctx.paper)
    out = []
    runs = [(claim, None) for claim in ctx.paper["claims"]]
    ours = [c for c in ctx.paper["claims"] if c["id"] in ON_OURS]
    runs += [(claim, bench) for bench in ours_benchmarks(ctx.cfg) for claim in ours]
    for claim, bench in runs:
        spec = specs.get(claim["id"], {})
        check = CLAIMS.get(claim["id"])
        status, comps = check(ctx, spec, [bench] if bench else None) if check else ("MISSING", [])
        text = spec.get("check", "no check implemented for this claim id")
        out.append(
            {
                "id": claim["id"] if bench is None else f"{claim['id']}@{bench}",
                "text": claim["text"] if bench is None else f"{claim['text']} [checked on {bench}, ours]",
                "status": status,
                "check": text if bench is None else f"As for {claim['id']}, on {bench} alone in place of "
                                                     "the paper's benchmarks.",
                "comparisons": [
                    {"comparison": name, **(c.interval.as_dict() if c.ok else {"missing": list(c.missing)})}
                    for name, c in comps
                ],
            }
        )
    return out


def learning_results(ctx: ReportContext) -> list[dict]:
    """``report.learning`` on each ``evaluation.ours_benchmarks`` entry: per trained model, its score and
    the base model's, and ``trained - base`` paired over tasks with its interval (percent); ``status``
    RISES (interval above 0), NO_RISE, or MISSING (an evaluation is absent or partial). Every score reads
    the learning check's seeds (:func:`learning_seeds`: Avg@k over them), recorded in ``seeds``."""
    spec = ctx.cfg["report"].get("learning")
    out: list[dict] = []
    seeds = learning_seeds(ctx.cfg)
    for bench in ours_benchmarks(ctx.cfg) if spec else []:
        base = ctx.mean("eval", spec["base"], [bench], seeds=seeds)
        for model in spec["models"]:
            trained = ctx.mean("eval", model, [bench], seeds=seeds)
            gain = ctx.cell("eval", [(1.0, model), (-1.0, spec["base"])], [bench], seeds=seeds)
            run = ctx.cfg["training"]["runs"].get(ctx.cfg["models"][model].get("run"), {})
            entry = {"model": model, "base_model": spec["base"], "benchmark": bench, "seeds": seeds,
                     "training_seed": run.get("seed"),  # None: verl's defaults
                     "base": base.interval.point if base.ok else None,
                     "trained": trained.interval.point if trained.ok else None}
            if gain.ok:
                entry.update(gain.interval.as_dict(), status="RISES" if gain.interval.low > 0 else "NO_RISE")
            else:
                entry.update(missing=list(gain.missing), status="MISSING")
            out.append(entry)
    return out


def released_results(ctx: ReportContext, ours: Sequence[dict] | None = None) -> dict[str, Any] | None:
    """The released weights' section (module docstring), ``None`` without ``released`` in the config.
    ``ours``: our entries, whose value goes beside each released cell as ``ours_trained`` (``None``: not
    computed, as in ``--released-only``)."""
    swap = released_models(ctx.cfg)
    if not swap:
        return None
    view = ReportContext(ctx.cfg, ctx.results_dir, paper=ctx.paper, resamples=ctx.resamples,
                         view=ReleasedView.of(ctx.cfg))
    labels = {ctx.cfg["models"][m]["label"] for m in swap}
    tts = ctx.cfg["tts"]["actor"] in swap
    entries = [e for e in table_entries(view) if (e["table"] in ("table1", "table2") and e["row"] in labels)
               or (e["table"] == "table3" and tts)]
    by_key = {(e["table"], e["row"], e["column"]): e for e in ours or []}
    for e in entries:
        e["ours_trained"] = by_key.get((e["table"], e["row"], e["column"]), {}).get("ours")
    return {"models": swap, **_checked(view, entries, claim_results(view))}


def _checked(ctx: ReportContext, entries: list[dict], claims: list[dict]) -> dict[str, Any]:
    """Provenance, status counts, entries and claims: the body of a diff and of its released section."""
    return {
        "header": ctx.header(),
        "header_line": ctx.header_line(),
        "counts": dict(Counter(e["status"] for e in entries)),
        "claim_counts": dict(Counter(c["status"] for c in claims)),
        "entries": entries,
        "claims": claims,
    }


def build_diff(ctx: ReportContext) -> dict[str, Any]:
    entries = table_entries(ctx) + figure_entries(ctx)
    diff = {**_checked(ctx, entries, claim_results(ctx)), "learning": learning_results(ctx)}
    released = released_results(ctx, entries)
    if released is not None:
        diff["released"] = released
    return diff


def to_markdown(diff: dict[str, Any]) -> str:
    lines = ["# EnvACE: our results vs the paper", "", f"_{diff['header_line']}_", ""]
    lines.append("Cell statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(diff["counts"].items())))
    lines.append("")
    lines += ["| table | row | column | paper | ours | 95% CI | delta | status | note |", "|---" * 9 + "|"]
    for e in diff["entries"]:
        d = e["decimals"]
        lines.append(
            f"| {e['table']} | {e['row']} | {e['column']} | {number(e['paper'], d)} | {number(e['ours'], d)} "
            f"| {bounds(e, d)} | {number(e['delta'], d)} | {e['status']} | {e['note']} |"
        )
    lines += ["", "## Claims", ""]
    lines += _claim_lines(diff["claims"])
    if diff.get("learning"):
        seeds = diff["learning"][0].get("seeds")
        lines += ["", "## Learning on our benchmarks (ours: report.learning)", ""]
        if seeds:
            lines += [f"Avg@{len(seeds)}: evaluation seeds {', '.join(map(str, seeds))}.", ""]
        lines += ["| benchmark | model | training seed | base | trained | gain | 95% CI | status |",
                  "|---" * 8 + "|"]
        for e in diff["learning"]:
            gain = "—" if e["status"] == "MISSING" else f"{e['point']:+.2f}"
            ci = "—" if e["status"] == "MISSING" else f"[{e['ci_low']:+.2f}, {e['ci_high']:+.2f}]"
            seed = "verl default" if e["training_seed"] is None else e["training_seed"]
            lines.append(f"| {e['benchmark']} | {e['model']} | {seed} | {number(e['base'], 2)} "
                         f"| {number(e['trained'], 2)} | {gain} | {ci} | {e['status']} |")
    if diff.get("released"):
        lines += ["", *released_markdown(diff["released"], heading="##")]
    return "\n".join(lines) + "\n"


def _claim_lines(claims: Sequence[dict]) -> list[str]:
    lines = []
    for c in claims:
        lines += [f"- **{c['id']}** — {c['status']}: {c['text']}", f"  - check: {c['check'].strip()}"]
        for comp in c["comparisons"]:
            if "missing" in comp:
                lines.append(f"  - {comp['comparison']}: MISSING ({'; '.join(comp['missing'])})")
            else:
                lines.append(f"  - {comp['comparison']}: {signed(comp, 2)}")
    return lines


def released_markdown(released: dict[str, Any], heading: str = "#") -> list[str]:
    """The released weights' section as Markdown lines (``heading``: its level)."""
    models = ", ".join(f"{ours} -> {rel}" for ours, rel in released["models"].items())
    with_ours = any(e.get("ours_trained") is not None for e in released["entries"])
    lines = [f"{heading} The authors' released weights through our evaluators", "",
             f"Released checkpoints in place of ours: {models}. Rows: the replaced models' Table 1-2 rows and"
             " Table 3 (the TTS suite with the released weights as actor and EnvACE rehearser)"
             + ("; `ours (trained)`: the same cell of our own run." if with_ours else "."), "",
             "Cell statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(released["counts"].items())), ""]
    head = ["table", "row", "column", "paper", "released", "95% CI", "delta", "status"]
    head += ["ours (trained)"] if with_ours else []
    lines += ["| " + " | ".join(head) + " | note |", "|---" * (len(head) + 1) + "|"]
    for e in released["entries"]:
        d = e["decimals"]
        cells = [e["table"], e["row"], e["column"], number(e["paper"], d), number(e["ours"], d), bounds(e, d),
                 number(e["delta"], d), e["status"]]
        cells += [number(e.get("ours_trained"), d)] if with_ours else []
        lines.append("| " + " | ".join(str(c) for c in cells) + f" | {e['note']} |")
    lines += ["", f"{heading}# Claims with the released weights", ""]
    lines += _claim_lines(released["claims"])
    return lines


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("diff", help="cell-by-cell and claim-by-claim comparison with the paper")
    add_common_args(p)
    p.add_argument("--out-md", help="default: {paths.results}/paper_diff.md")
    p.add_argument("--out-json", help="default: {paths.results}/paper_diff.json")
    p.add_argument("--strict", action="store_true", help="exit 1 if a cell is OUTSIDE_CI or a claim REFUTED")
    p.add_argument("--released-only", action="store_true",
                   help="only the released weights' section (config `released`), to released_diff.{md,json}; "
                   "reads no result of a model we train")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    try:
        ctx = context_from_args(args)
        if args.released_only:
            return _run_released(args, ctx)
        diff = build_diff(ctx)
    except ResultsError as exc:
        print(f"envace diff: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    default_md, default_json = diff_paths(ctx.cfg)
    args.out_md, args.out_json = args.out_md or default_md, args.out_json or default_json
    write_output(args.out_json, json.dumps(diff, indent=2) + "\n")
    write_output(args.out_md, to_markdown(diff))
    print(
        f"diff: wrote {args.out_md} and {args.out_json} ({len(diff['entries'])} cells: "
        f"{', '.join(f'{k} {v}' for k, v in sorted(diff['counts'].items()))}; claims: "
        f"{', '.join(f'{k} {v}' for k, v in sorted(diff['claim_counts'].items()))})"
    )
    failed = diff["counts"].get("OUTSIDE_CI", 0) + diff["claim_counts"].get("REFUTED", 0)
    return 1 if args.strict and failed else 0


def _run_released(args: argparse.Namespace, ctx: ReportContext) -> int:
    """``--released-only``: the released weights' section alone (exit 2 without ``released``)."""
    released = released_results(ctx)
    if released is None:
        print(f"envace diff: {args.config} has no `released` block (our model id -> released model id)",
              file=sys.stderr)
        return EXIT_UNUSABLE
    default_md, _ = diff_paths(ctx.cfg)
    md = Path(args.out_md or default_md.with_name("released_diff.md"))
    out_json = Path(args.out_json or md.with_suffix(".json"))
    write_output(out_json, json.dumps(released, indent=2) + "\n")
    write_output(md, "\n".join([*released_markdown(released), "", f"_{released['header_line']}_"]) + "\n")
    print(f"diff: wrote {md} and {out_json} ({len(released['entries'])} cells: "
          f"{', '.join(f'{k} {v}' for k, v in sorted(released['counts'].items()))}; claims: "
          f"{', '.join(f'{k} {v}' for k, v in sorted(released['claim_counts'].items()))})")
    failed = released["counts"].get("OUTSIDE_CI", 0) + released["claim_counts"].get("REFUTED", 0)
    return 1 if args.strict and failed else 0
