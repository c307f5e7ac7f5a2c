"""Context length of test-time scaling runs (what the paper blames for Figure 6's drop at N = 3).

From the per-sample TTS result lines (``{results}/tts/{setting}/{benchmark}/seed{S}.jsonl``), each of
which carries the episode's :class:`envace.core.tts.TTSRecord` as ``extra["tts"]``, this module computes per
(TTS setting, benchmark), pooled over the configured ``tts.seeds``:

* **final-execution context**: ``commit_final_context_tokens`` (prompt + reply of the commit's last ACT
  generation, i.e. the longest context the actor saw in the real episode), mean and max over the
  records whose commit generated at least once (``commits``); a record with ``0`` (the commit never
  generated) has no context and is left out of the mean, but counted in ``records``;
* **rehearsal memory**: ``memory_tokens`` (the memory appended to the commit's system prompt, in the
  actor's tokenizer), mean and max over all records (an empty memory counts as 0).

Missing data (documented choice: skip and count, never guess):

* a line without ``extra["tts"]`` (``no_tts``, a sample that failed before its commit, or files written
  before TTS recorded context) or whose record lacks one of the two fields is **skipped** and counted
  (``lines - records``); when no line of a (setting, benchmark) has them, the row is MISSING with a
  reason and the figure draws no context point;
* a field that is present but not a non-negative integer raises :class:`~envace.common.results.ResultsError`
  naming the file and line (corrupt results);
* an absent or partial result file makes the row MISSING (as a MISSING cell elsewhere); a corrupt one or
  one with a stale config hash raises, as every report does.

:func:`overall` combines benchmarks as Figure 6's Overall does: the mean of the per-benchmark means
(each benchmark weighs the same), the max of the maxima; MISSING if any benchmark is. Records marked
``"synthetic": true`` (the generated example results) are counted in ``synthetic``.
:func:`csv_text` renders rows as CSV with a ``#`` provenance line first, as the table CSVs do (the
figure command writes it atomically with :func:`envace.report.context.write_output`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.common.config import tts_hash
from envace.common.results import IncompleteResultsError, ResultsError, read_results, tts_path
from envace.common.settings import TTSSetting

FINAL_FIELD = "commit_final_context_tokens"
MEMORY_FIELD = "memory_tokens"
OVERALL = "overall"
CSV_COLUMNS = (
    "setting",
    "mode",
    "n",
    "rehearser",
    "benchmark",
    "lines",
    "records",
    "commits",
    "final_context_tokens_mean",
    "final_context_tokens_max",
    "memory_tokens_mean",
    "memory_tokens_max",
    "synthetic",
    "missing",
)


@dataclass(frozen=True)
class ContextStats:
    """Context-length summary of one (setting, benchmark) or its Overall; values ``None`` when MISSING.

    ``lines``: result lines read; ``records``: lines with both fields; ``commits``: records whose commit
    generated (final context > 0); ``missing``: why there are no values (``None`` when there are);
    ``synthetic``: records marked ``"synthetic": true`` (the shipped example data, no model ran).
    """

    setting: str
    benchmark: str
    lines: int
    records: int
    commits: int
    final_context_mean: float | None
    final_context_max: int | None
    memory_mean: float | None
    memory_max: int | None
    missing: str | None = None
    synthetic: int = 0

    @property
    def ok(self) -> bool:
        return self.missing is None


def _token_count(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ResultsError(f"{where}: extra.tts.{name} must be a non-negative integer, got {value!r}")
    return value


def _record_values(line: Mapping[str, Any], where: str) -> tuple[int, int, bool] | None:
    """``(final context, memory, synthetic)`` of one result line, or ``None`` without a usable record."""
    extra = line.get("extra")
    record = extra.get("tts") if isinstance(extra, Mapping) else None
    if not isinstance(record, Mapping) or FINAL_FIELD not in record or MEMORY_FIELD not in record:
        return None
    return (
        _token_count(record[FINAL_FIELD], FINAL_FIELD, where),
        _token_count(record[MEMORY_FIELD], MEMORY_FIELD, where),
        record.get("synthetic") is True,
    )


def summarize(
    setting: str,
    benchmark: str,
    sources: Iterable[tuple[str, Sequence[Mapping[str, Any]]]],
) -> ContextStats:
    """Summarize result lines; ``sources``: ``(name for error messages, lines)`` per result file."""
    n_lines = 0
    finals: list[int] = []
    memories: list[int] = []
    synthetic = 0
    for name, lines in sources:
        for i, line in enumerate(lines, start=1):
            n_lines += 1
            values = _record_values(line, f"{name}: line {i}")
            if values is None:
                continue
            finals.append(values[0])
            memories.append(values[1])
            synthetic += values[2]
    commits = [v for v in finals if v > 0]
    if not memories:
        why = "no result line" if n_lines == 0 else f"none of its {n_lines} lines has extra.tts.{FINAL_FIELD}"
        return ContextStats(setting, benchmark, n_lines, 0, 0, None, None, None, None, why)
    return ContextStats(
        setting=setting,
        benchmark=benchmark,
        lines=n_lines,
        records=len(memories),
        commits=len(commits),
        final_context_mean=sum(commits) / len(commits) if commits else None,
        final_context_max=max(commits) if commits else None,
        memory_mean=sum(memories) / len(memories),
        memory_max=max(memories),
        missing=None if commits else "no commit generated (every final context is 0)",
        synthetic=synthetic,
    )


def load(cfg: Mapping[str, Any], results_dir: str | Path, setting: str, benchmark: str) -> ContextStats:
    """Read every ``tts.seeds`` run of ``setting`` on ``benchmark`` (hash-checked) and summarize it."""
    sources = []
    for seed in cfg["tts"]["seeds"]:
        try:
            path = tts_path(results_dir, setting, benchmark, seed)
            res = read_results(path, expected_hash=tts_hash(cfg, setting, benchmark))
        except IncompleteResultsError as exc:
            return ContextStats(setting, benchmark, 0, 0, 0, None, None, None, None, str(exc))
        sources.append((str(res.path), res.lines))
    return summarize(setting, benchmark, sources)


def overall(setting: str, stats: Sequence[ContextStats]) -> ContextStats:
    """Benchmark-stratified combination: mean of means, max of maxima; MISSING if any benchmark is."""
    if not stats:
        raise ValueError("overall needs at least one benchmark")
    missing = [f"{s.benchmark}: {s.missing}" for s in stats if not s.ok]
    lines, records, commits, synthetic = (
        sum(getattr(s, k) for s in stats) for k in ("lines", "records", "commits", "synthetic")
    )
    if missing:
        why = "; ".join(missing)
        return ContextStats(setting, OVERALL, lines, records, commits, None, None, None, None, why, synthetic)
    # an ok row has every value (summarize), hence the `or 0` never applies
    return ContextStats(
        setting=setting,
        benchmark=OVERALL,
        lines=lines,
        records=records,
        commits=commits,
        final_context_mean=sum(s.final_context_mean or 0.0 for s in stats) / len(stats),
        final_context_max=max(s.final_context_max or 0 for s in stats),
        memory_mean=sum(s.memory_mean or 0.0 for s in stats) / len(stats),
        memory_max=max(s.memory_max or 0 for s in stats),
        synthetic=synthetic,
    )


def _fmt(value: float | int | None) -> str:
    if value is None:
        return ""
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def csv_text(rows: Sequence[ContextStats], header: str) -> str:
    """The CSV: ``# header``, the column names, one row per :class:`ContextStats` (empty = MISSING)."""
    buf = io.StringIO()
    buf.write(f"# {header}\n")
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for s in rows:
        mode, n, rehearser = _parse_setting(s.setting)
        writer.writerow(
            [s.setting, mode, n, rehearser, s.benchmark, s.lines, s.records, s.commits,
             _fmt(s.final_context_mean), _fmt(s.final_context_max), _fmt(s.memory_mean),
             _fmt(s.memory_max), s.synthetic, s.missing or ""]
        )
    return buf.getvalue()


def _parse_setting(setting: str) -> tuple[str, str, str]:
    """``parallel_n2_envace`` -> ``("parallel", "2", "envace")``; ``no_tts`` -> ``("no_tts", "", "")``."""
    parsed = TTSSetting.parse(setting)
    return (str(parsed.mode), str(parsed.n), parsed.rehearser) if parsed.is_tts else (setting, "", "")


def csv_path(figure_out: str | Path) -> Path:
    """``figures/fig6_tts_vs_n.pdf`` -> ``figures/fig6_tts_vs_n_context.csv``."""
    out = Path(figure_out)
    return out.with_name(f"{out.stem}_context.csv")

