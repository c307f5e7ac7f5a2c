"""Shared machinery of the report subcommands: cells with bootstrap intervals, options, provenance.

:class:`ReportContext` loads each evaluation once (:func:`envace.report.evaluations.load_evaluation`),
turns a request "this linear combination of methods over these benchmarks" into a :class:`Cell` (an
:class:`~envace.common.stats.Interval` in percent, or the reasons it is MISSING) and collects the provenance
written in every output header: scale, config hash, report commit, the commits and package versions
recorded in the manifests actually used, seeds, and the bootstrap settings.

A context may read the **released-weights view** (:class:`ReleasedView`, ``released`` in the config):
every evaluation of one of our models is read from its released checkpoint's results and every TTS
setting from the released suite's, while our other trained models (and checkpoints) are not part of it
(their cells are MISSING with that reason). The same tables, points and claims then describe the
authors' released weights through our evaluators.

It also caches the context-length summaries of TTS runs (:meth:`ReportContext.tts_context`, Figure 6)
and writes outputs atomically (:func:`write_output`).

A missing or partial evaluation makes the cell MISSING; corrupt or stale results, and a results
directory that does not exist, raise :class:`~envace.common.results.ResultsError`, which the subcommands
report
as an error (exit status 4, :data:`envace.common.exit_codes.EXIT_UNUSABLE`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.common.atomic import atomic_write_text
from envace.common.config import (
    DEFAULT_CONFIG,
    config_hash,
    figure5_models,
    load_config,
    model_entry,
    released_models,
)
from envace.common.results import IncompleteResultsError, ResultsError, current_git_commit
from envace.common.settings import TTSSetting
from envace.common.stats import Interval, bootstrap_linear
from envace.report.evaluations import Evaluation, load_evaluation
from envace.report.paper import load_paper
from envace.report.tts_context import ContextStats
from envace.report.tts_context import load as load_tts_context

PERCENT = 100.0


@dataclass(frozen=True)
class Cell:
    """A reported quantity in percent, or why it is missing."""

    interval: Interval | None
    missing: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.interval is not None

    def text(self, decimals: int) -> str:
        """``"36.70 [33.10, 40.20]"``, ``"36.70 (degenerate)"`` or ``"MISSING"``."""
        if self.interval is None:
            return "MISSING"
        iv = self.interval
        if iv.degenerate:
            return f"{iv.point:.{decimals}f} (degenerate)"
        return f"{iv.point:.{decimals}f} [{iv.low:.{decimals}f}, {iv.high:.{decimals}f}]"


@dataclass(frozen=True)
class ReleasedView:
    """Which stored results a name reads in the released-weights view (module docstring)."""

    swap: dict[str, str]

    @classmethod
    def of(cls, cfg: dict[str, Any]) -> ReleasedView:
        return cls(released_models(cfg))

    def stored(self, cfg: dict[str, Any], kind: str, name: str) -> str:
        """The stored name (model id or TTS setting id) behind ``name``; IncompleteResultsError for a
        trained model of ours without a released checkpoint."""
        if kind == "tts":
            return str(TTSSetting.parse(name).in_suite("released"))
        if name in self.swap:
            return self.swap[name]
        if model_entry(cfg, name).get("kind") == "trained":
            raise IncompleteResultsError(f"{name}: trained by us, not part of the released-weights view")
        return name


class ReportContext:
    """Evaluations, cells and provenance for one configuration and results directory (``view``: the
    released-weights view, or ``None`` for our own results)."""

    def __init__(
        self,
        cfg: dict[str, Any],
        results_dir: str | Path,
        *,
        paper: dict[str, Any] | None = None,
        resamples: int | None = None,
        view: ReleasedView | None = None,
    ) -> None:
        self.cfg = cfg
        self.view = view
        self.results_dir = Path(results_dir)
        self.paper = paper if paper is not None else load_paper()
        boot = cfg["report"]["bootstrap"]
        self.resamples = int(resamples or boot["resamples"])
        self.seed = int(boot["seed"])
        self.confidence = float(boot["confidence"])
        self._evaluations: dict[
            tuple[str, str, str, str | None, str | None, tuple[int, ...] | None],
            Evaluation | IncompleteResultsError,
        ] = {}
        self._tts_context: dict[tuple[str, str], ContextStats] = {}

    def evaluation(self, kind: str, name: str, benchmark: str, metric: str | None = None,
                   average: str | None = None, seeds: Sequence[int] | None = None) -> Evaluation:
        """The loaded evaluation (cached); raises IncompleteResultsError if missing or partial.

        ``average`` (``micro`` / ``macro``) overrides ``aggregate.average`` for count metrics; ``seeds``
        the evaluation seeds read (default the config's ``seeds``)."""
        key = (kind, name, benchmark, metric, average, tuple(seeds) if seeds is not None else None)
        if key not in self._evaluations:
            try:
                stored = self.view.stored(self.cfg, kind, name) if self.view else name
                self._evaluations[key] = load_evaluation(
                    self.cfg, self.results_dir, kind, stored, benchmark, metric, average, seeds
                )
            except IncompleteResultsError as exc:
                self._evaluations[key] = exc
        found = self._evaluations[key]
        if isinstance(found, IncompleteResultsError):
            raise found
        return found

    def tts_context(self, setting: str, benchmark: str) -> ContextStats:
        """Context-length summary of one TTS run (cached; :func:`envace.report.tts_context.load`)."""
        key = (setting, benchmark)
        if key not in self._tts_context:
            stored = self.view.stored(self.cfg, "tts", setting) if self.view else setting
            self._tts_context[key] = load_tts_context(self.cfg, self.results_dir, stored, benchmark)
        return self._tts_context[key]

    def cell(
        self,
        kind: str,
        terms: Sequence[tuple[float, str]],
        benchmarks: Sequence[str],
        metric: str | None = None,
        average: str | None = None,
        seeds: Sequence[int] | None = None,
    ) -> Cell:
        """``mean over benchmarks of sum_i coef_i * score(name_i)`` in percent, with its interval.

        Terms on one benchmark share task draws (paired); benchmarks are resampled independently.
        ``seeds``: the evaluation seeds read (default the config's ``seeds``).
        """
        blocks, missing = [], []
        for bench in benchmarks:
            block = []
            for coef, name in terms:
                try:
                    block.append((coef, self.evaluation(kind, name, bench, metric, average, seeds).matrix))
                except IncompleteResultsError as exc:
                    missing.append(str(exc))
            blocks.append(block)
        if missing:
            return Cell(None, tuple(missing))
        try:
            interval = bootstrap_linear(
                blocks, resamples=self.resamples, seed=self.seed, confidence=self.confidence
            )
        except ValueError as exc:
            names = ", ".join(name for _, name in terms)
            raise ResultsError(f"cannot pair {names} on {list(benchmarks)}: {exc}") from exc
        return Cell(interval.scaled(PERCENT))

    def mean(
        self,
        kind: str,
        name: str,
        benchmarks: Sequence[str],
        metric: str | None = None,
        average: str | None = None,
        seeds: Sequence[int] | None = None,
    ) -> Cell:
        """One method's score (Avg@k), averaged over ``benchmarks`` (benchmark-stratified)."""
        return self.cell(kind, [(1.0, name)], benchmarks, metric, average, seeds)

    def checkpoint_model(self, step: int) -> str:
        """Model id evaluated for training step ``step`` of the checkpoint run:
        :func:`envace.common.config.figure5_models` (``{run}-stepNNNN``; the run's last step is its final
        model)."""
        return figure5_models(self.cfg)[step]

    def used_evaluations(self) -> list[Evaluation]:
        return [e for e in self._evaluations.values() if isinstance(e, Evaluation)]

    def header(self) -> dict[str, Any]:
        """Provenance of everything computed so far."""
        used = self.used_evaluations()
        commits = sorted({m["git_commit"] or "unknown" for e in used for m in e.manifests})
        versions: dict[str, list[str]] = {}
        for e in used:
            for m in e.manifests:
                for pkg, ver in m["package_versions"].items():
                    if ver not in versions.setdefault(pkg, []):
                        versions[pkg].append(ver)
        return {
            "scale": self.cfg["scale"].upper(),
            "config_hash": config_hash(self.cfg),
            "report_commit": current_git_commit(Path(__file__).parent) or "unknown",
            "results_commits": commits,
            "package_versions": versions,
            "seeds": list(self.cfg["seeds"]),
            "tts_seeds": list(self.cfg["tts"]["seeds"]),
            "bootstrap": {
                "resamples": self.resamples,
                "seed": self.seed,
                "confidence": self.confidence,
                "method": "two-level percentile bootstrap (envace.common.stats)",
            },
            "results_dir": str(self.results_dir),
            "paper": self.paper["_path"],
        }

    def header_line(self) -> str:
        h = self.header()
        boot = h["bootstrap"]
        return (
            f"{h['scale']} scale | report commit {h['report_commit'][:12]} | results commits "
            f"{','.join(c[:12] for c in h['results_commits']) or 'none'} | config {h['config_hash']} | "
            f"seeds {h['seeds']} (TTS {h['tts_seeds']}) | bootstrap {boot['resamples']} resamples, "
            f"seed {boot['seed']}, {boot['confidence']:.0%} percentile intervals | values in %"
        )


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """``--config``, ``--results-dir``, ``--paper``, ``--resamples``."""
    parser.add_argument(
        "--config", default=DEFAULT_CONFIG,
        help="experiment config (config/config.yaml, config/smoke.yaml; default: %(default)s)",
    )
    parser.add_argument(
        "--results-dir",
        default=None,
        help="per-sample results root (default: the config's report_source, else paths.results)",
    )
    parser.add_argument(
        "--paper", default=None, help="paper numbers (default: paper_tables/paper_numbers.yaml)"
    )
    parser.add_argument(
        "--resamples",
        type=int,
        default=None,
        help="override report.bootstrap.resamples (recorded in the header)",
    )


def context_from_args(args: argparse.Namespace) -> ReportContext:
    """The context of a report subcommand. Raises :class:`~envace.common.results.ResultsError` when the
    results
    directory does not exist: a mistyped folder must not turn into a table of MISSING cells."""
    cfg = load_config(args.config)
    if args.results_dir:
        results_dir, origin = args.results_dir, "--results-dir"
    elif cfg.get("report_source"):
        results_dir, origin = cfg["report_source"], f"report_source of {args.config}"
    else:
        results_dir, origin = cfg["paths"]["results"], f"paths.results of {args.config}"
    if not Path(results_dir).is_dir():
        what = "is not a directory" if Path(results_dir).exists() else "does not exist"
        raise ResultsError(f"results directory {results_dir} ({origin}) {what}")
    return ReportContext(cfg, results_dir, paper=load_paper(args.paper), resamples=args.resamples)


def write_output(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically, creating parent directories: a crash leaves the old file or
    none, never a partial one (:func:`envace.common.atomic.atomic_write_text`; the file gets the umask's
    permissions)."""
    return atomic_write_text(path, text, parents=True)
