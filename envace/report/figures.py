"""``envace figures {fig3,fig4,fig5,fig6}``: the paper's figures from our results (PDF + PNG beside it).

* fig3 — ablation bars on tau2: standard GRPO, per-role policy, shared EnvACE.
* fig4 — scaling 1.7B -> 8B, EnvACE vs GRPO, one panel per benchmark (BFCL-v4, tau2).
* fig5 — checkpoint score vs training step.
* Figures 3-5 get one more panel (fig5: one more line) per ``evaluation.ours_benchmarks`` entry, titled
  "(ours)" and without paper points (:func:`envace.common.config.ours_benchmarks`).
* fig6 — TTS Overall vs number of rehearsals N (no TTS at N = 0), one panel per mode, one line per
  rehearser; the paper's Table 3 values (N = 2 and no TTS) are drawn as its only known points. One more
  row of panels per ``evaluation.ours_benchmarks`` entry: its TTS score alone, titled "(ours)". On a
  secondary (right) axis, shared by a row's panels, dashed lines in the rehearser's colour give the mean
  final-execution context in tokens (that benchmark's, or the mean over ``tts.benchmarks`` of each one's, see
  :mod:`envace.report.tts_context`) at each N >= 1, the paper's explanation of its N = 3 drop; a panel
  without any context record says so, and the axis label says SYNTHETIC when records are marked so.
  The same command writes ``<out stem>_context.csv`` beside the PDF (every TTS setting x benchmark and
  Overall: mean / max final context and memory tokens, counts, why MISSING), atomically.

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

from envace.common.config import ours_benchmarks
from envace.common.exit_codes import EXIT_UNUSABLE
from envace.common.results import ResultsError, figure_path  # noqa: E402
from envace.common.settings import TTSSetting  # noqa: E402
from envace.report import points, tts_context  # noqa: E402
from envace.report.context import (  # noqa: E402
    Cell,
    ReportContext,
    add_common_args,
    context_from_args,
    write_output,
)
from envace.report.tts_context import OVERALL  # noqa: E402

PAPER_STYLE = {"marker": "X", "color": "crimson", "s": 70, "zorder": 5, "label": "paper"}
CONTEXT_STYLE = {"linestyle": "--", "marker": "s", "markersize": 4, "linewidth": 1.2, "alpha": 0.8}
CONTEXT_LABEL = "mean final context"


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


def _bench_title(bench: str) -> str:
    """A panel's benchmark name; ours (``evaluation.ours_benchmarks``) say so."""
    return bench if bench in points.FIG4_BENCHMARKS or bench == points.FIG3_BENCHMARK else f"{bench} (ours)"


def fig3(ctx: ReportContext, fig: Figure) -> None:
    benches = [points.FIG3_BENCHMARK, *ours_benchmarks(ctx.cfg)]
    axes = fig.subplots(1, len(benches), squeeze=False)[0]
    for ax, bench in zip(axes, benches, strict=True):
        cells = points.figure3(ctx, bench)
        names = list(cells)
        xs = list(range(len(names)))
        heights = [cells[n].interval.point if cells[n].ok else 0.0 for n in names]
        ax.bar(xs, heights, color="steelblue", alpha=0.6)
        # a marker and the value at each of our points: a bar of height 0 is otherwise invisible
        _errorbar(ax, xs, [cells[n] for n in names], "ours (95% CI)", fmt="o", color="black", ecolor="black",
                  markersize=4)
        for x, n in zip(xs, names, strict=True):
            if cells[n].ok:
                ax.annotate(f"{cells[n].interval.point:.1f}", (x, cells[n].interval.high), ha="center",
                            va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
        if bench == points.FIG3_BENCHMARK:
            _paper(ax, xs, [ctx.paper["figure3"]["points"].get(n) for n in names])
        ax.set_xticks(xs, [n.replace("_", " ") for n in names])
        ax.set_ylabel(f"{_bench_title(bench)} average (%)")
        low, high = ax.get_ylim()  # room below 0, so a point at 0 sits above the axis, not on it
        ax.set_ylim(min(low, 0.0) - 0.04 * (high - min(low, 0.0)), high * 1.08 if high > 0 else 1.0)
        ax.legend()
    fig.suptitle("Ablation (Figure 3)")


def fig4(ctx: ReportContext, fig: Figure) -> None:
    data = points.figure4(ctx)
    paper = ctx.paper["figure4"]["points"]
    benches = [*points.FIG4_BENCHMARKS, *ours_benchmarks(ctx.cfg)]
    axes = fig.subplots(1, len(benches), squeeze=False)[0]
    for ax, bench in zip(axes, benches, strict=True):
        for i, (method, sizes) in enumerate(data.items()):
            labels = list(sizes)
            xs = [j + 0.05 * (i - 0.5) for j in range(len(labels))]
            _errorbar(ax, xs, [sizes[s][bench] for s in labels], method, fmt="-o")
            _paper(ax, xs, [paper.get(method, {}).get(s, {}).get(bench) for s in labels], first=i == 0)
            ax.set_xticks(range(len(labels)), labels)
        ax.set_title(_bench_title(bench))
        ax.set_xlabel("model size")
        ax.set_ylabel("score (%)")
        ax.legend()
    fig.suptitle("Scaling (Figure 4)")


def fig5(ctx: ReportContext, fig: Figure) -> None:
    bench = ctx.cfg["evaluation"]["checkpoints"]["benchmark"]
    rehearse = points.figure5_rehearse(ctx)
    ax, rax = fig.subplots(1, 2) if rehearse else (fig.add_subplot(), None)
    for extra in [None, *ours_benchmarks(ctx.cfg)]:
        cells = points.figure5(ctx, extra)
        steps = list(cells)
        label = f"ours on {bench} (95% CI)" if extra is None else f"ours on {extra} (ours, 95% CI)"
        _errorbar(ax, steps, [cells[s] for s in steps], label, fmt="-o")
    known = {int(s): v for s, v in ctx.paper["figure5"]["points"].items()}
    _paper(ax, list(known), list(known.values()))
    ax.set_xlabel("training step")
    ax.set_ylabel("score (%)" if ours_benchmarks(ctx.cfg) else f"{bench} score (%)")
    ax.set_title("ACT: checkpoint score (Figure 5)")
    ax.legend()
    if rax is not None:  # the REHEARSE role's dynamics (ours): its training rollouts vs the references
        for run, series in rehearse.items():
            rax.plot(list(series), list(series.values()), "-o", markersize=3, label=run)
        rax.set_ylim(-2, 102)
        rax.set_xlabel("training step")
        rax.set_ylabel("answers equal to the reference (%)")
        rax.set_title("REHEARSE: exact match in training (ours)")
        rax.legend()


def fig6(ctx: ReportContext, fig: Figure) -> None:
    context = points.figure6_context(ctx)
    tts = ctx.cfg["tts"]
    rows = [None, *ours_benchmarks(ctx.cfg)]  # None: the paper's TTS Overall
    grid = fig.subplots(len(rows), len(tts["modes"]), sharey="row", squeeze=False)
    for axes, bench in zip(grid, rows, strict=True):
        no_tts, curves = points.figure6(ctx, bench)
        twins: list[Axes] = []  # one context scale per row: benchmarks' contexts differ by orders
        top = 0.0
        synthetic = 0
        for ax, mode in zip(axes, tts["modes"], strict=True):
            twins.append(ax.twinx())
            marked, highest = _fig6_panel(ctx, ax, twins[-1], mode, bench, (no_tts, curves), context)
            synthetic, top = synthetic + marked, max(top, highest)
        for twin in twins:
            twin.set_ylim(0, top * 1.15 if top else 1.0)
            twin.tick_params(labelright=twin is twins[-1])
        note = "; SYNTHETIC" if synthetic else ""
        twins[-1].set_ylabel(f"{CONTEXT_LABEL}, tokens (dashed{note})", fontsize=8)
    fig.suptitle("Test-time scaling vs N (Figure 6)")


def _fig6_panel(ctx: ReportContext, ax: Axes, twin: Axes, mode: str, bench: str | None,
                data: tuple[Cell, dict[tuple[str, str], dict[int, Cell]]],
                context: dict[str, dict[str, Any]]) -> tuple[int, float]:
    """One mode's panel of Figure 6 on the TTS Overall (``bench`` None, with the paper's Table 3 points)
    or on one of ours; returns its (SYNTHETIC context records, highest context mean drawn)."""
    tts = ctx.cfg["tts"]
    paper = ctx.paper["table3"]["rows"]
    t3 = {setting: row for row, setting in tts["table3"].items()}
    no_tts, curves = data
    first = True
    drawn = False
    synthetic, top = 0, 0.0
    for i, reh in enumerate(tts["rehearsers"]):
        color = f"C{i}"
        cells = curves[(mode, reh)]
        ns = [0, *cells]
        _errorbar(ax, ns, [no_tts, *cells.values()], f"{reh} rehearser", fmt="-o", color=color)
        settings = ["no_tts", *(str(TTSSetting(mode, n, reh)) for n in cells)]
        if bench is None:
            _paper(ax, ns, [paper.get(t3.get(s, ""), {}).get("overall") for s in settings], first=first)
        first = False
        stats = [(n, context[str(TTSSetting(mode, n, reh))][bench or OVERALL]) for n in cells]
        synthetic += sum(s.synthetic for _, s in stats)
        have = [(n, s.final_context_mean) for n, s in stats if s.ok and s.final_context_mean is not None]
        if have:
            twin.plot(*zip(*have, strict=True), color=color, label=f"{reh}: {CONTEXT_LABEL}", **CONTEXT_STYLE)
            top = max(top, *(v for _, v in have))
            drawn = True
    if not drawn:
        ax.text(0.5, 0.02, "context length: no TTS records", transform=ax.transAxes, ha="center",
                va="bottom", fontsize=7, color="grey")
    ax.set_xticks([0, *tts["n"]])
    ax.set_title(mode if bench is None else f"{mode}, {_bench_title(bench)}")
    ax.set_xlabel("rehearsals N (0 = no TTS)")
    ax.set_ylabel("TTS Overall (%)" if bench is None else f"{bench} TTS score (%)")
    handles, labels = ax.get_legend_handles_labels()
    twin_handles, twin_labels = twin.get_legend_handles_labels()
    twin.legend(handles + twin_handles, labels + twin_labels, fontsize=7, loc="center right")
    return synthetic, top


def fig6_context_csv(ctx: ReportContext, out: Path) -> Path:
    """Figure 6's context lengths, every TTS setting x (benchmarks, Overall), beside the figure."""
    rows = [stats for per_bench in points.figure6_context(ctx).values() for stats in per_bench.values()]
    header = ctx.header_line().removesuffix(" | values in %") + " | values in tokens"
    return write_output(tts_context.csv_path(out), tts_context.csv_text(rows, header))


FIGURES: dict[str, Callable[[ReportContext, Figure], None]] = {
    "fig3": fig3,
    "fig4": fig4,
    "fig5": fig5,
    "fig6": fig6,
}
SIDECARS: dict[str, Callable[[ReportContext, Path], Path]] = {"fig6": fig6_context_csv}


def render(ctx: ReportContext, name: str, out: str | Path) -> list[Path]:
    """Draw figure ``name`` and save it to ``out`` (PDF) and the PNG beside it, plus its data file if
    it has one (:data:`SIDECARS`: fig6 -> ``<stem>_context.csv``); returns the paths written."""
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
    paths = [out, png]
    if name in SIDECARS:
        paths.append(SIDECARS[name](ctx, out))
    return paths


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("figures", help="Figures 3-6 with bootstrap error bars and the paper's points")
    p.add_argument("figure", choices=sorted(FIGURES), help="which figure of the paper")
    add_common_args(p)
    p.add_argument(
        "--out", help="output PDF, PNG written beside (default: {paths.figures}/<figure file>.pdf, e.g. "
        "figures/fig3_ablation.pdf)"
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    try:
        ctx = context_from_args(args)
        paths = render(ctx, args.figure, args.out or figure_path(ctx.cfg, args.figure))
    except ResultsError as exc:
        print(f"envace figures: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    print(f"figures: wrote {', '.join(map(str, paths))} ({args.figure}, {ctx.cfg['scale'].upper()} scale)")
    return 0
