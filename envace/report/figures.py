"""``envace figures {fig3,fig4,fig5,fig6}``: the paper's figures from our results (PDF + PNG beside it).

* fig3 — ablation bars on tau2: standard GRPO, per-role policy, shared EnvACE.
* fig4 — scaling 1.7B -> 8B, EnvACE vs GRPO, one panel per benchmark (BFCL-v4, tau2).
* fig5 — checkpoint score vs training step.
* fig6 — TTS Overall vs number of rehearsals N (no TTS at N = 0), one panel per mode, one line per
  rehearser; the paper's Table 3 values (N = 2 and no TTS) are drawn as its only known points.

Our values are drawn with their bootstrap intervals as error bars; the paper's known values as red
crosses; a missing point is labelled MISSING. At smoke scale the title says SMOKE and a watermark crosses
the figure. Quantities come from :mod:`envace.report.points`. Matplotlib's Agg backend is used.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from envace.report import points  # noqa: E402
from envace.report.context import Cell, ReportContext, add_common_args, context_from_args  # noqa: E402
from envace.results import ResultsError  # noqa: E402

PAPER_STYLE = {"marker": "X", "color": "crimson", "s": 70, "zorder": 5, "label": "paper"}


def _errorbar(ax: Axes, xs: Sequence[float], cells: Sequence[Cell], label: str, **kw: Any) -> None:
    """Our points with interval error bars; MISSING labels where a cell has no value."""
    have = [(x, c.interval) for x, c in zip(xs, cells, strict=True) if c.ok]
    if have:
        x, iv = zip(*have, strict=True)
        y = [i.point for i in iv]
        err = [[i.point - i.low for i in iv], [i.high - i.point for i in iv]]
        ax.errorbar(x, y, yerr=err, capsize=4, label=label, **kw)
    for x, c in zip(xs, cells, strict=True):
        if not c.ok:
            ax.annotate("MISSING", (x, 0), ha="center", va="bottom", fontsize=7, color="grey", rotation=90)


def _paper(ax: Axes, xs: Sequence[float], values: Sequence[float | None], first: bool = True) -> None:
    known = [(x, v) for x, v in zip(xs, values, strict=True) if v is not None]
    if known:
        style = PAPER_STYLE if first else {**PAPER_STYLE, "label": None}
        ax.scatter(*zip(*known, strict=True), **style)


def fig3(ctx: ReportContext, fig: Figure) -> None:
    ax = fig.add_subplot()
    cells = points.figure3(ctx)
    names = list(cells)
    xs = list(range(len(names)))
    heights = [cells[n].interval.point if cells[n].ok else 0.0 for n in names]
    ax.bar(xs, heights, color="steelblue", alpha=0.6)
    _errorbar(ax, xs, [cells[n] for n in names], "ours (95% CI)", fmt="none", ecolor="black")
    _paper(ax, xs, [ctx.paper["figure3"]["points"].get(n) for n in names])
    ax.set_xticks(xs, [n.replace("_", " ") for n in names])
    ax.set_ylabel(f"{points.FIG3_BENCHMARK} average (%)")
    ax.set_title("Ablation (Figure 3)")
    ax.legend()


def fig4(ctx: ReportContext, fig: Figure) -> None:
    data = points.figure4(ctx)
    paper = ctx.paper["figure4"]["points"]
    axes = fig.subplots(1, len(points.FIG4_BENCHMARKS))
    for ax, bench in zip(axes, points.FIG4_BENCHMARKS, strict=True):
        for i, (method, sizes) in enumerate(data.items()):
            labels = list(sizes)
            xs = [j + 0.05 * (i - 0.5) for j in range(len(labels))]
            _errorbar(ax, xs, [sizes[s][bench] for s in labels], method, fmt="-o")
            _paper(ax, xs, [paper.get(method, {}).get(s, {}).get(bench) for s in labels], first=i == 0)
            ax.set_xticks(range(len(labels)), labels)
        ax.set_title(bench)
        ax.set_xlabel("model size")
        ax.set_ylabel("score (%)")
        ax.legend()
    fig.suptitle("Scaling (Figure 4)")


def fig5(ctx: ReportContext, fig: Figure) -> None:
    ax = fig.add_subplot()
    cells = points.figure5(ctx)
    steps = list(cells)
    _errorbar(ax, steps, [cells[s] for s in steps], "ours (95% CI)", fmt="-o")
    known = {int(s): v for s, v in ctx.paper["figure5"]["points"].items()}
    _paper(ax, list(known), list(known.values()))
    ax.set_xlabel("training step")
    ax.set_ylabel(f"{ctx.cfg['evaluation']['checkpoints']['benchmark']} score (%)")
    ax.set_title("Training dynamics (Figure 5)")
    ax.legend()


def fig6(ctx: ReportContext, fig: Figure) -> None:
    no_tts, curves = points.figure6(ctx)
    tts = ctx.cfg["tts"]
    paper = ctx.paper["table3"]["rows"]
    t3 = {setting: row for row, setting in tts["table3"].items()}
    axes = fig.subplots(1, len(tts["modes"]), sharey=True, squeeze=False)[0]
    for ax, mode in zip(axes, tts["modes"], strict=True):
        first = True
        for reh in tts["rehearsers"]:
            cells = curves[(mode, reh)]
            ns = [0, *cells]
            _errorbar(ax, ns, [no_tts, *cells.values()], f"{reh} rehearser", fmt="-o")
            settings = ["no_tts", *(f"{mode}_n{n}_{reh}" for n in cells)]
            _paper(ax, ns, [paper.get(t3.get(s, ""), {}).get("overall") for s in settings], first=first)
            first = False
        ax.set_xticks([0, *tts["n"]])
        ax.set_title(mode)
        ax.set_xlabel("rehearsals N (0 = no TTS)")
        ax.set_ylabel("TTS Overall (%)")
        ax.legend()
    fig.suptitle("Test-time scaling vs N (Figure 6)")


FIGURES: dict[str, Callable[[ReportContext, Figure], None]] = {
    "fig3": fig3,
    "fig4": fig4,
    "fig5": fig5,
    "fig6": fig6,
}


def render(ctx: ReportContext, name: str, out: str | Path) -> list[Path]:
    """Draw figure ``name`` and save it to ``out`` (PDF) and the PNG beside it."""
    fig = plt.figure(figsize=(9, 4.5), layout="constrained")
    try:
        FIGURES[name](ctx, fig)
        if ctx.cfg["scale"] == "smoke":
            fig.suptitle(f"SMOKE — {fig.get_suptitle() or fig.axes[0].get_title()} — not a reproduction")
            fig.text(
                0.5,
                0.5,
                "SMOKE",
                fontsize=80,
                color="grey",
                alpha=0.15,
                ha="center",
                va="center",
                rotation=30,
            )
        # keep a strip at the bottom for the provenance line, clear of the axis labels
        fig.get_layout_engine().set(rect=(0, 0.035, 1, 0.965))
        fig.text(0.0, 0.0, ctx.header_line(), fontsize=5, color="dimgrey", ha="left", va="bottom", wrap=True)
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        png = out.with_suffix(".png")
        fig.savefig(out)
        fig.savefig(png, dpi=150)
    finally:
        plt.close(fig)
    return [out, png]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("figures", help="Figures 3-6 with bootstrap error bars and the paper's points")
    p.add_argument("figure", choices=sorted(FIGURES))
    add_common_args(p)
    p.add_argument(
        "--out", required=True, help="output PDF, e.g. figures/fig3_ablation.pdf (PNG written beside)"
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    ctx = context_from_args(args)
    try:
        paths = render(ctx, args.figure, args.out)
    except ResultsError as exc:
        print(f"envace figures: {exc}", file=sys.stderr)
        return 2
    print(f"figures: wrote {paths[0]} and {paths[1]} ({args.figure}, {ctx.cfg['scale'].upper()} scale)")
    return 0
