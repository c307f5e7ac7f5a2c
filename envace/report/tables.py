"""``envace tables {table1,table2,table3}``: our values with bootstrap intervals beside the paper's.

* Table 1: rows = ``evaluation.table1.models``, each followed by its released checkpoint (config
  ``released``: the authors' weights through our evaluators, beside the same paper values), then any
  paper row whose label no configured model has, all MISSING; columns = the table's benchmarks and
  Overall = plain mean of the benchmark averages with a benchmark-stratified interval. For each
  benchmark with ``aggregate.method: bfcl_eval`` a note says which Overall its values are
  (:func:`envace.report.evaluations.describe_overall`: ``leaderboard Overall`` or ``re-weighted,
  without ...``), one per distinct description, naming the rows when they differ. Each of
  ``evaluation.ours_benchmarks`` (ours, no paper column: the ledger) is one more column after Overall
  (the ledger's title has a dagger), never in Overall; a note says so.
* Table 2: rows = ``evaluation.table2.models`` (released checkpoints as in Table 1); columns = the
  benchmark's ``aggregate.metrics`` (FinMCP: tp, tr, tf1), averaged as ``aggregate.average`` says
  (default ``micro``: the metrics of the tool counts summed over samples, the paper's definition). A
  micro table also carries the macro values (means of per-sample values, with their intervals) as
  ``<metric>_macro`` columns in the CSV, a labelled second table in the Markdown and comment lines in
  the TeX; the diff compares only the main columns. Each of ``evaluation.ours_benchmarks`` is one more
  column (its score).
* Table 3: rows = ``tts.table3`` (row name -> TTS setting); columns = each ``tts.benchmarks`` score,
  Overall = their mean, and delta = Overall(setting) - Overall(no_tts) with a paired interval; then each
  of ``evaluation.ours_benchmarks`` (its TTS score; in neither Overall nor delta).

Each table is written as ``tableN.csv`` (one ``#`` header line, then per column: value, ci_low, ci_high,
degenerate, paper, missing reason), ``tableN.md`` and ``tableN.tex`` (booktabs). Values are percent; a
cell without a complete evaluation reads MISSING and its reason is listed under the table, so a partial
table is never silent. The header line gives scale (SMOKE/PAPER), commits, config hash, seeds and the
bootstrap settings.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from envace.common.config import ours_benchmarks, released_models
from envace.common.exit_codes import EXIT_UNUSABLE
from envace.common.results import ResultsError, tables_dir
from envace.report.context import Cell, ReportContext, add_common_args, context_from_args, write_output
from envace.report.evaluations import COUNT_METRICS, describe_overall
from envace.report.paper import decimals

TITLES = {
    "bfcl_v4": ("BFCL-v4", "BFCL-v4"),
    "tau2": ("τ²-Bench", r"$\tau^2$-Bench"),
    "vitabench": ("VitaBench", "VitaBench"),
    "overall": ("Overall", "Overall"),
    "tp": ("TP", "TP"),
    "tr": ("TR", "TR"),
    "tf1": ("TF1", "TF1"),
    "bfcl_multi_turn": ("BFCL MT", "BFCL MT"),
    "delta": ("Δ vs no TTS", r"$\Delta$ vs no TTS"),
    "ledger": ("Ledger†", r"Ledger$^\dagger$"),
}
NOT_IN_CONFIG = "no model with this label in the config"


@dataclass
class Row:
    """One table row: our cells (None = not applicable) and the paper's values."""

    key: str
    label: str
    cells: dict[str, Cell | None]
    paper: dict[str, float | None]
    extra: dict[str, Cell | None] = field(default_factory=dict)


@dataclass
class Table:
    name: str
    caption: str
    columns: list[str]
    decimals: dict[str, int]
    rows: list[Row] = field(default_factory=list)
    extra_columns: list[str] = field(default_factory=list)  # e.g. tp_macro: reported beside, not diffed
    notes: list[str] = field(default_factory=list)


def _paper_rows(ctx: ReportContext, name: str) -> dict[str, dict[str, float | None]]:
    return ctx.paper[name]["rows"]


def _model_rows(ctx: ReportContext, name: str, columns: list[str], cells: Callable[[str], dict]) -> list[Row]:
    """Rows for configured models, each followed by its released checkpoint's row (config ``released``,
    beside the same paper values; not in the released-weights view, where our row already reads it), then
    MISSING rows for paper labels that no configured model has."""
    paper = _paper_rows(ctx, name)
    swap = released_models(ctx.cfg) if ctx.view is None else {}
    rows = []
    for model in ctx.cfg["evaluation"][name]["models"]:
        label = ctx.cfg["models"][model]["label"]
        rows.append(Row(model, label, cells(model), dict(paper.get(label, {}))))
        if model in swap:
            rows.append(Row(swap[model], ctx.cfg["models"][swap[model]]["label"], cells(swap[model]),
                            dict(paper.get(label, {}))))
    have = {r.label for r in rows}
    for label, values in paper.items():
        if label not in have:
            rows.append(Row("", label, {c: Cell(None, (NOT_IN_CONFIG,)) for c in columns}, dict(values)))
    return rows


def build_table1(ctx: ReportContext) -> Table:
    benches = list(ctx.cfg["evaluation"]["table1"]["benchmarks"])
    ours = ours_benchmarks(ctx.cfg)
    columns = [*benches, "overall", *ours]

    def cells(model: str) -> dict[str, Cell | None]:
        out: dict[str, Cell | None] = {b: ctx.mean("eval", model, [b]) for b in benches}
        out["overall"] = ctx.mean("eval", model, benches)
        out.update({b: ctx.mean("eval", model, [b]) for b in ours})
        return out

    table = Table("table1", ctx.paper["table1"]["caption"], columns, _decimals(ctx, "table1", columns))
    table.rows = _model_rows(ctx, "table1", columns, cells)
    table.notes += _overall_notes(ctx, benches, table.rows)
    table.notes += _ours_note(ours, "not in Overall")
    return table


def _ours_note(ours: list[str], where: str) -> list[str]:
    """The note under a table with columns of ``evaluation.ours_benchmarks`` (none without them)."""
    if not ours:
        return []
    titles = ", ".join(TITLES.get(b, (b,))[0] for b in ours)
    return [f"{titles}: ours (evaluation.ours_benchmarks): not a paper benchmark, so no paper value; "
            f"{where}."]


def _overall_notes(ctx: ReportContext, benches: list[str], rows: list[Row]) -> list[str]:
    """``"<title>: <describe_overall>"`` per benchmark with ``aggregate.method: bfcl_eval`` and distinct
    description among the rows whose cell is complete; ``" — rows: <labels>"`` is appended when a
    benchmark's rows have more than one description."""
    notes = []
    for bench in benches:
        spec = ctx.cfg["benchmarks"][bench]
        if spec["aggregate"].get("method") != "bfcl_eval":
            continue
        by_text: dict[str, list[str]] = {}
        for row in rows:
            cell = row.cells.get(bench)
            if cell is not None and cell.ok:
                text = describe_overall(ctx.evaluation("eval", row.key, bench), spec["package"])
                by_text.setdefault(text, []).append(row.label)
        title = TITLES.get(bench, (bench,))[0]
        for text, labels in by_text.items():
            notes.append(f"{title}: {text}" + (f" — rows: {', '.join(labels)}" if len(by_text) > 1 else ""))
    return notes


def build_table2(ctx: ReportContext) -> Table:
    (bench,) = ctx.cfg["evaluation"]["table2"]["benchmarks"]
    aggregate = ctx.cfg["benchmarks"][bench]["aggregate"]
    metrics = list(aggregate.get("metrics", [aggregate["metric"]]))
    ours = ours_benchmarks(ctx.cfg)
    columns = [*metrics, *ours]

    def cells(model: str) -> dict[str, Cell | None]:
        out: dict[str, Cell | None] = {m: ctx.mean("eval", model, [bench], metric=m) for m in metrics}
        out.update({b: ctx.mean("eval", model, [b]) for b in ours})
        return out

    table = Table("table2", ctx.paper["table2"]["caption"], columns, _decimals(ctx, "table2", columns))
    table.rows = _model_rows(ctx, "table2", columns, cells)
    table.notes += _ours_note(ours, f"its score, beside {TITLES.get(bench, (bench,))[0]}'s metrics")
    counted = [m for m in metrics if m in COUNT_METRICS.get(bench, {})]
    if counted and aggregate.get("average", "micro") == "micro":
        table.extra_columns = [f"{m}_macro" for m in counted]
        table.notes.append(
            f"{', '.join(TITLES.get(m, (m,))[0] for m in counted)}: micro averages (tool counts summed "
            "over all samples of all runs, as the paper's TF1 = F1(TP, TR)); the macro averages (means of "
            "per-sample values) are reported beside them (columns *_macro)."
        )
        for row in table.rows:
            if row.key:
                row.extra = {f"{m}_macro": ctx.mean("eval", row.key, [bench], m, "macro") for m in counted}
    elif counted:
        table.notes.append("TP / TR / TF1: macro averages (means of per-sample values; aggregate.average).")
    return table


def build_table3(ctx: ReportContext) -> Table:
    tts = ctx.cfg["tts"]
    benches = list(tts["benchmarks"])
    ours = ours_benchmarks(ctx.cfg)
    columns = [*benches, "overall", "delta", *ours]
    base = tts["table3"]["no_tts"]
    paper = _paper_rows(ctx, "table3")
    table = Table("table3", ctx.paper["table3"]["caption"], columns, _decimals(ctx, "table3", columns))
    for key, setting in tts["table3"].items():
        cells: dict[str, Cell | None] = {b: ctx.mean("tts", setting, [b]) for b in benches}
        cells["overall"] = ctx.mean("tts", setting, benches)
        cells["delta"] = None if setting == base else ctx.cell("tts", [(1.0, setting), (-1.0, base)], benches)
        cells.update({b: ctx.mean("tts", setting, [b]) for b in ours})
        table.rows.append(Row(key, f"{key} ({setting})", cells, dict(paper.get(key, {}))))
    table.notes += _ours_note(ours, "not in Overall or Δ")
    return table


BUILDERS: dict[str, Callable[[ReportContext], Table]] = {
    "table1": build_table1,
    "table2": build_table2,
    "table3": build_table3,
}


def _decimals(ctx: ReportContext, name: str, columns: list[str]) -> dict[str, int]:
    return {c: decimals(ctx.paper, name, c) for c in columns}


def _paper_text(value: float | None, dec: int) -> str:
    return "—" if value is None else f"{value:.{dec}f}"


def _missing_notes(table: Table) -> list[str]:
    notes = []
    for row in table.rows:
        for col, cell in row.cells.items():
            if cell is not None and not cell.ok:
                notes.append(f"{row.label} / {col}: MISSING — {'; '.join(cell.missing)}")
    return notes


def to_frame(table: Table) -> pd.DataFrame:
    records = []
    for row in table.rows:
        rec: dict[str, Any] = {"row": row.key, "label": row.label}
        for col in table.columns:
            cell = row.cells.get(col)
            iv = cell.interval if cell is not None else None
            rec[col] = iv.point if iv else None
            rec[f"{col}_ci_low"] = iv.low if iv else None
            rec[f"{col}_ci_high"] = iv.high if iv else None
            rec[f"{col}_degenerate"] = iv.degenerate if iv else None
            rec[f"{col}_paper"] = row.paper.get(col)
            rec[f"{col}_missing"] = "; ".join(cell.missing) if cell is not None and not cell.ok else ""
        for col in table.extra_columns:
            iv = (row.extra.get(col) or Cell(None)).interval
            rec[col] = iv.point if iv else None
            rec[f"{col}_ci_low"] = iv.low if iv else None
            rec[f"{col}_ci_high"] = iv.high if iv else None
        records.append(rec)
    return pd.DataFrame.from_records(records)


def to_markdown(table: Table, header: str) -> str:
    heads = ["Method"] + [
        f"{TITLES.get(c, (c,))[0]} {w}" for c in table.columns for w in ("(ours)", "(paper)")
    ]
    lines = [f"# {table.name} (paper caption: {table.caption})", "", f"_{header}_", ""]
    lines.append("| " + " | ".join(heads) + " |")
    lines.append("|---" + "|---:" * (len(heads) - 1) + "|")
    for row in table.rows:
        parts = [row.label]
        for col in table.columns:
            cell, dec = row.cells.get(col), table.decimals[col]
            parts += ["—" if cell is None else cell.text(dec), _paper_text(row.paper.get(col), dec)]
        lines.append("| " + " | ".join(parts) + " |")
    if table.extra_columns:
        lines += ["", "Beside it, not compared with the paper:", ""]
        lines.append("| Method | " + " | ".join(table.extra_columns) + " |")
        lines.append("|---" + "|---:" * len(table.extra_columns) + "|")
        for row in table.rows:
            if row.extra:
                parts = [_extra_text(table, row, c) for c in table.extra_columns]
                lines.append(f"| {row.label} | " + " | ".join(parts) + " |")
    if table.notes:
        lines += [""] + [f"Note: {n}" for n in table.notes]
    notes = _missing_notes(table)
    if notes:
        lines += ["", "MISSING cells:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _extra_text(table: Table, row: Row, col: str) -> str:
    """A beside-the-table cell (``tp_macro``) printed with its main column's decimals."""
    cell = row.extra.get(col)
    return "—" if cell is None else cell.text(table.decimals[col.rsplit("_", 1)[0]])


def _tex_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "&%$#_{}" else ch for ch in text)


def _tex_cell(cell: Cell | None, dec: int) -> str:
    if cell is None:
        return "--"
    if cell.interval is None:
        return r"\textsc{missing}"
    iv = cell.interval
    if iv.degenerate:
        return f"{iv.point:.{dec}f}$^{{\\dagger}}$"
    return f"{iv.point:.{dec}f} {{\\scriptsize [{iv.low:.{dec}f}, {iv.high:.{dec}f}]}}"


def to_latex(table: Table, header: str) -> str:
    n = len(table.columns)
    lines = [
        f"% {table.name}: {_tex_escape(table.caption)}",
        f"% {header}",
        r"% cells: ours [95% CI] | paper; \dagger = degenerate (every resample identical)",
        r"\begin{tabular}{l" + " rr" * n + "}",
        r"\toprule",
        "Method & "
        + " & ".join(
            rf"\multicolumn{{2}}{{c}}{{{TITLES.get(c, (c, _tex_escape(c)))[1]}}}" for c in table.columns
        )
        + r" \\",
        " ".join(rf"\cmidrule(lr){{{2 + 2 * i}-{3 + 2 * i}}}" for i in range(n)),
        " & " + " & ".join(["Ours & Paper"] * n) + r" \\",
        r"\midrule",
    ]
    for row in table.rows:
        parts = [_tex_escape(row.label)]
        for col in table.columns:
            dec = table.decimals[col]
            value = row.paper.get(col)
            parts += [_tex_cell(row.cells.get(col), dec), "--" if value is None else f"{value:.{dec}f}"]
        lines.append(" & ".join(parts) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += [f"% note: {n}" for n in table.notes]
    for row in table.rows:
        if row.extra:
            extra = ", ".join(f"{c} {_extra_text(table, row, c)}" for c in row.extra)
            lines.append(f"% {row.label}: {extra}")
    return "\n".join(lines) + "\n"


def write_table(table: Table, header: str, out_dir: str | Path) -> list[Path]:
    out_dir = Path(out_dir)
    csv = f"# {header}\n" + to_frame(table).to_csv(index=False)
    return [
        write_output(out_dir / f"{table.name}.csv", csv),
        write_output(out_dir / f"{table.name}.md", to_markdown(table, header)),
        write_output(out_dir / f"{table.name}.tex", to_latex(table, header)),
    ]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("tables", help="Tables 1-3 with bootstrap CIs beside the paper's values")
    p.add_argument("table", choices=sorted(BUILDERS), help="which table of the paper")
    add_common_args(p)
    p.add_argument("--out-dir", help="writes OUT_DIR/tableN.{csv,md,tex} (default: {paths.results}/tables)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    try:
        ctx = context_from_args(args)
        table = BUILDERS[args.table](ctx)
    except ResultsError as exc:
        print(f"envace tables: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    paths = write_table(table, ctx.header_line(), args.out_dir or tables_dir(ctx.cfg))
    cells = [c for r in table.rows for c in r.cells.values() if c is not None]
    n_missing = sum(not c.ok for c in cells)
    print(
        f"tables: wrote {', '.join(str(p) for p in paths)} ({len(table.rows)} rows, {len(cells)} cells, "
        f"{n_missing} MISSING, {ctx.cfg['scale'].upper()} scale)"
    )
    return 0
