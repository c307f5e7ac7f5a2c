"""The quantities behind Figures 3-6 as :class:`~envace.report.context.Cell` s (shared by figures and diff).

* Figure 3: tau2 score of ``report.fig3`` models (standard GRPO, per-role policy, shared EnvACE).
* Figure 4: BFCL-v4 and tau2 of ``report.fig4`` models (method -> size -> model).
* Figure 5: score on ``evaluation.checkpoints.benchmark`` at every checkpoint step
  (:meth:`ReportContext.checkpoint_model`); beside it, the REHEARSE role's per-step exact match with the
  reference responses in each ``report.fig5_rehearse_runs`` run's training rollouts
  (:func:`figure5_rehearse`, from ``<results>/train/<run>/done.json``).
* Figures 3-5 also on each of ``evaluation.ours_benchmarks`` (ours, no paper points):
  ``benchmark=`` of :func:`figure3` / :func:`figure5`, the extra keys of :func:`figure4`.
* Figure 6: Overall (mean of ``tts.benchmarks``) of every TTS setting ``{mode}_n{N}_{rehearser}`` and of
  ``no_tts`` (drawn at N = 0), and the same on each of ``evaluation.ours_benchmarks`` alone; beside it
  the context length of every TTS setting
  (:func:`figure6_context`: mean final-execution context and rehearsal memory tokens, per benchmark and
  Overall, from :mod:`envace.report.tts_context`; ``no_tts`` records none and is not summarized).
"""

from __future__ import annotations

import json

from envace.common.config import fig5_rehearse_runs, ours_benchmarks
from envace.common.settings import TTSSetting
from envace.report.context import Cell, ReportContext
from envace.report.tts_context import OVERALL, ContextStats, overall

FIG3_BENCHMARK = "tau2"
FIG4_BENCHMARKS = ("bfcl_v4", "tau2")


def figure3(ctx: ReportContext, benchmark: str = FIG3_BENCHMARK) -> dict[str, Cell]:
    return {point: ctx.mean("eval", model, [benchmark]) for point, model in ctx.cfg["report"]["fig3"].items()}


def figure4(ctx: ReportContext) -> dict[str, dict[str, dict[str, Cell]]]:
    """method -> size -> benchmark (:data:`FIG4_BENCHMARKS`, then ``evaluation.ours_benchmarks``) -> cell."""
    benches = [*FIG4_BENCHMARKS, *ours_benchmarks(ctx.cfg)]
    return {
        method: {size: {b: ctx.mean("eval", model, [b]) for b in benches} for size, model in sizes.items()}
        for method, sizes in ctx.cfg["report"]["fig4"].items()
    }


def figure5(ctx: ReportContext, benchmark: str | None = None) -> dict[int, Cell]:
    """step -> cell on ``benchmark`` (default ``evaluation.checkpoints.benchmark``)."""
    ckpt = ctx.cfg["evaluation"]["checkpoints"]
    bench = benchmark or ckpt["benchmark"]
    return {step: ctx.mean("eval", ctx.checkpoint_model(step), [bench]) for step in ckpt["steps"]}


def figure5_rehearse(ctx: ReportContext, metric: str = "reference_exact") -> dict[str, dict[int, float]]:
    """run -> training step -> ``envace/rehearse/<metric>`` in percent, from each
    :func:`~envace.common.config.fig5_rehearse_runs` run's done-file (``rehearse_per_step``, written by
    ``envace train``). A run without a done-file or without the metric is left out (a results folder from
    before the metric, or a run whose calls no model answered)."""
    out: dict[str, dict[int, float]] = {}
    for run in fig5_rehearse_runs(ctx.cfg):
        done = ctx.results_dir / "train" / run / "done.json"
        if not done.is_file():
            continue
        per_step = (json.loads(done.read_text()).get("rehearse_per_step") or {}).get(metric) or {}
        if per_step:
            steps = sorted(per_step, key=int)
            out[run] = {int(s): 100.0 * float(per_step[s]) for s in steps}
    return out


def figure6(ctx: ReportContext, benchmark: str | None = None
            ) -> tuple[Cell, dict[tuple[str, str], dict[int, Cell]]]:
    """(no_tts cell, (mode, rehearser) -> N -> cell), on the TTS Overall (mean of ``tts.benchmarks``) or,
    given ``benchmark`` (one of ``evaluation.ours_benchmarks``), on that benchmark alone."""
    tts = ctx.cfg["tts"]
    benches = [benchmark] if benchmark else list(tts["benchmarks"])
    curves = {
        (mode, reh): {n: ctx.mean("tts", str(TTSSetting(mode, n, reh)), benches) for n in tts["n"]}
        for mode in tts["modes"]
        for reh in tts["rehearsers"]
    }
    return ctx.mean("tts", "no_tts", benches), curves


def figure6_context(ctx: ReportContext) -> dict[str, dict[str, ContextStats]]:
    """TTS setting ``{mode}_n{N}_{rehearser}`` -> benchmark (each of ``tts.benchmarks``, ``"overall"`` of
    them, then each of ``evaluation.ours_benchmarks``, not in that Overall) -> context-length summary, in
    the config's order (the rows of the figure's CSV)."""
    tts = ctx.cfg["tts"]
    out: dict[str, dict[str, ContextStats]] = {}
    for mode in tts["modes"]:
        for reh in tts["rehearsers"]:
            for n in tts["n"]:
                setting = str(TTSSetting(mode, n, reh))
                per_bench = {b: ctx.tts_context(setting, b) for b in tts["benchmarks"]}
                ours = {b: ctx.tts_context(setting, b) for b in ours_benchmarks(ctx.cfg)}
                out[setting] = {**per_bench, OVERALL: overall(setting, list(per_bench.values())), **ours}
    return out
