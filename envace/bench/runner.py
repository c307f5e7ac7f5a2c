"""Drive benchmark episodes through the core rollout loop and write per-sample results with resume.

Implemented:
- :func:`run_episode`: one ``(task, sample, seed)``. The agent chat starts with ``system`` + ``first_user``;
  :func:`envace.core.rollout.run_rollout` runs in ``Mode.REAL`` with the episode as the environment until the
  agent answers in text; ``episode.user_reply`` gives the next user message (``None`` ends the
  conversation); then ``episode.score()``. An episode may expose ``current_tools()`` (e.g. BFCL's
  miss_func adds functions mid-conversation); the runner then re-reads the tool list every user turn.
  The ``max_turns`` budget counts ACT turns over the whole conversation. Two optional episode hooks:
  ``max_act_turns`` caps the ACT turns of the episode (BFCL single-turn: 1; reaching the cap is a normal
  end, scored by the episode) and ``scores_parse_errors = True`` hands an unparsable output to the
  episode's own scorer instead of failing the sample (BFCL irrelevance counts it as "no call"). An
  episode's ``system_prompt()``, if it has one, replaces ``task.system`` (BFCL memory: the memory's
  content when the episode starts).
- Prerequisite stages: an adapter with ``prerequisite_stages(tasks)`` (BFCL memory: the conversations
  that fill the memory before the questions) has those tasks run first, stage after stage (each stage's
  samples concurrently), every sample of them before any other task. They are resumed like any sample
  but not scored: their lines go to :func:`prerequisite_path` (a complete result file with its manifest),
  the main file's ``timing`` counts them (``prerequisite_samples``, ``prerequisite_failed``).
- Outcomes: an exception inside the episode (adapter, environment, scorer) -> ``status: failed`` with the
  exception as ``reason``, score 0. An episode the rollout ended abnormally (unparsable output, endless
  output hitting the token budget, too many turns) -> ``status: failed``, score 0, reason naming the
  :class:`envace.core.rollout.Termination`. A backend failure (:class:`BackendError`: the model server died or
  is unreachable) is NOT a sample result: it aborts the run, so the sample is retried on resume.
- A line is encoded with :func:`envace.common.results.encode_line`, so nothing a model wrote (a lone
surrogate,
  NaN, nesting of any depth) can stop the writer; what had to be replaced is counted in the line's
  ``json_repairs``. A line that still violates the result-line schema (e.g. a sub-score outside [0, 1]
  or NaN from a scorer) is recorded as a failed sample naming the problem.
- :class:`PartialResults`: ``<out>.partial.jsonl`` (one line per finished sample, appended, flushed and
  fsynced) + ``<out>.partial.meta.json`` (config hash, start time). A restart with the same config hash
  keeps every finished line; another hash starts afresh. A line that cannot be read back (truncated by
  a crash, cut inside a UTF-8 sequence, not a result line) is dropped with everything after it, and the
  log (stderr) says which line and how many samples will run again.
  :func:`run_samples` runs the missing samples (``concurrency`` at a time), then writes the final
  ``<out>`` + manifest atomically through :func:`envace.common.results.write_results`, in task order, and
  removes
  the partial files.

Simplification (ours): each user turn starts a fresh :func:`run_rollout` over the whole chat so far, so
the token budget ``max_response_tokens`` applies per user turn and the prompt is re-encoded per user turn.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.common.atomic import atomic_write_bytes, atomic_write_json
from envace.common.results import ResultsError, _now, encode_line, line_problem, write_results
from envace.core.environment import BenchmarkAdapter, Episode, Services, Task
from envace.core.episode import exception_result, is_exception_result, run_episode
from envace.core.rollout import GenerateBackend, RolloutConfig
from envace.core.tools import ChatTemplateTokenizer

__all__ = [
    "PartialResults",
    "run_samples",
    "RunStats",
    "prerequisite_path",
]


@dataclass
class RunStats:
    """Timing of a run: ``model_s`` is the time spent inside backend ``generate`` calls."""

    samples: int = 0
    wall_s: float = 0.0
    model_s: float = 0.0


class _TimedBackend:
    """Wraps a backend, accumulating the seconds spent in ``generate`` into ``stats.model_s``."""

    def __init__(self, inner: GenerateBackend, stats: RunStats) -> None:
        self.inner = inner
        self.stats = stats

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        t0 = time.perf_counter()
        try:
            return await self.inner.generate(prompt_ids, sampling_params)
        finally:
            self.stats.model_s += time.perf_counter() - t0


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _read_line(chunk: bytes) -> dict[str, Any] | None:
    """One partial-file line, or ``None`` if it cannot be read back as a result line (torn, not UTF-8,
    not JSON, NaN, or against the result-line schema: the final file could not be written from it)."""
    try:
        line = json.loads(chunk.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return line if isinstance(line, dict) and line_problem(line) is None else None


def _checked_line(line: dict[str, Any]) -> dict[str, Any]:
    """``line``, or when (once encoded) it violates the result-line schema, a failed sample saying why."""
    text, _ = encode_line(line)
    problem = line_problem(json.loads(text))
    if problem is None:
        return line
    kept = ("benchmark", "split", "task_id", "sample", "seed", "trajectory")
    keep = {k: line[k] for k in kept if k in line}
    return {**keep, "score": 0.0, "subscores": {}, "status": "failed",
            "reason": f"invalid result line: {problem}", "extra": {}}


class PartialResults:
    """The resumable partial result of one run (see the module docstring)."""

    def __init__(self, out: str | Path, config_hash: str) -> None:
        self.out = Path(out)
        self.path = self.out.with_name(self.out.name + ".partial.jsonl")
        self.meta_path = self.out.with_name(self.out.name + ".partial.meta.json")
        self.config_hash = config_hash
        self.lines: dict[tuple[str, int], dict[str, Any]] = {}
        self.started = _now()
        self._load()

    def _load(self) -> None:
        if not (self.path.exists() and self.meta_path.exists()):
            self._reset()
            return
        try:
            meta = json.loads(self.meta_path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError):
            meta = {}
        if not isinstance(meta, dict):
            meta = {}
        if meta.get("config_hash") != self.config_hash:
            print(
                f"envace eval: partial results {self.path} belong to another config "
                f"({meta.get('config_hash')} != {self.config_hash}); starting afresh",
                file=sys.stderr,
            )
            self._reset()
            return
        self.started = meta.get("started", self.started)
        good: list[bytes] = []
        chunks = self.path.read_bytes().split(b"\n")
        for number, chunk in enumerate(chunks, start=1):
            if not chunk:
                continue
            line = _read_line(chunk)
            if line is None:  # a line torn by a crash (or damaged): drop it and everything after
                after = sum(1 for c in chunks[number:] if c)
                also = f" and the {after} line(s) after it" if after else ""
                print(
                    f"envace eval: {self.path}: line {number} is torn or unreadable (a crash while it was "
                    f"written?); dropping it{also}: those samples run again ({len(self.lines)} finished "
                    "samples kept)",
                    file=sys.stderr,
                )
                break
            key = (line["task_id"], line["sample"])
            if key not in self.lines:
                self.lines[key] = line
                good.append(chunk + b"\n")
        atomic_write_bytes(self.path, b"".join(good))

    def _reset(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("", encoding="utf-8")
        atomic_write_json(self.meta_path, {"config_hash": self.config_hash, "started": self.started}, end="")

    def append(self, line: dict[str, Any]) -> dict[str, Any]:
        """Record one finished sample durably; returns the line as stored (and as a resume reads it).

        The line is encoded with :func:`envace.common.results.encode_line`: whatever its free-form fields
        hold,
        this writes valid UTF-8 JSON (replacements counted in ``json_repairs``).
        """
        key = (line["task_id"], line["sample"])
        if key in self.lines:
            raise ResultsError(f"{self.path}: duplicate sample {key}")
        text, _ = encode_line(line)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        stored = json.loads(text)
        self.lines[key] = stored
        return stored

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.meta_path.unlink(missing_ok=True)


def prerequisite_path(out: str | Path) -> Path:
    """The side result file of a run's prerequisite conversations (not scored): ``<out>`` with
    ``.prerequisites.jsonl`` for ``.jsonl``."""
    out = Path(out)
    return out.with_name(out.name.removesuffix(".jsonl") + ".prerequisites.jsonl")


#: ``(task, episode, backend, tokenizer, rollout_config) -> result fields`` (see :func:`run_episode`).
EpisodeFn = Callable[
    [Task, Episode, GenerateBackend, ChatTemplateTokenizer, RolloutConfig], Awaitable[dict[str, Any]]
]


async def run_samples(
    *,
    adapter: BenchmarkAdapter,
    tasks: list[Task],
    samples: int,
    seed: int,
    services: Services,
    backend_for: Callable[[Task, int], GenerateBackend],
    tokenizer: ChatTemplateTokenizer,
    config: RolloutConfig,
    out: str | Path,
    manifest: dict[str, Any],
    concurrency: int = 1,
    progress: bool = True,
    keep_trajectory: bool = True,
    episode_fn: EpisodeFn | None = None,
    extra_timing: Callable[[], dict[str, float]] | None = None,
) -> tuple[Path, RunStats]:
    """Run every ``(task, sample)`` not finished yet, then write ``out`` + manifest.

    ``backend_for(task, sample)`` gives the backend of one sample (the same object for a served model;
    a scripted one per task in self-checks). ``episode_fn`` runs one episode (default
    :func:`run_episode`; test-time scaling passes its own, with the same signature).
    ``manifest``: keyword arguments of
    :func:`envace.common.results.write_results` other than
    ``path``/``lines``/``started``/``benchmark``/``seed``
    (``model``, ``scale``, ``config_hash``, optionally ``package_versions``). The manifest's ``timing``
    holds ``wall_s``, ``model_s`` and ``samples`` of this call, plus whatever ``extra_timing()`` returns
    (``envace eval``: the CPU seconds of its model servers and of its own process).
    Raises :class:`BackendError` when the backend fails (the partial file keeps what finished).
    """
    stats = RunStats()
    t_start = time.perf_counter()
    partial = PartialResults(out, manifest["config_hash"])
    stages_fn = getattr(adapter, "prerequisite_stages", None)
    stages: list[list[Task]] = stages_fn(tasks) if callable(stages_fn) else []
    before = {t.task_id for stage in stages for t in stage}
    tasks = [t for t in tasks if t.task_id not in before]
    todo = [(t, s) for t in tasks for s in range(samples) if (t.task_id, s) not in partial.lines]
    todo_before = [[(t, s) for t in stage for s in range(samples) if (t.task_id, s) not in partial.lines]
                   for stage in stages]
    bar = None
    if progress:
        from tqdm import tqdm

        n_all = (len(tasks) + len(before)) * samples
        bar = tqdm(
            total=n_all,
            initial=n_all - len(todo) - sum(map(len, todo_before)),
            unit="sample",
            desc=f"{adapter.name} seed{seed}",
            file=sys.stderr,
            dynamic_ncols=True,
        )
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(task: Task, sample: int) -> None:
        async with sem:
            try:
                episode = adapter.new_episode(task, sample, seed, services)
            except Exception as exc:  # bad task data / missing service: this sample fails, the run goes on
                result = exception_result(exc, "new_episode")
            else:
                backend = _TimedBackend(backend_for(task, sample), stats)
                result = await (episode_fn or run_episode)(task, episode, backend, tokenizer, config)
        if not keep_trajectory:
            result.pop("trajectory", None)
        line = {
            "benchmark": adapter.name,
            "split": task.split,
            "task_id": task.task_id,
            "sample": sample,
            "seed": seed,
            **result,
        }
        partial.append(_checked_line(line))
        stats.samples += 1
        if bar is not None:
            bar.update(1)

    try:
        for stage_todo in todo_before:  # each stage needs the one before it (e.g. a memory chain)
            await asyncio.gather(*(one(t, s) for t, s in stage_todo))
        await asyncio.gather(*(one(t, s) for t, s in todo))
    finally:
        if bar is not None:
            bar.close()
    order = {(t.task_id, s): i for i, (t, s) in enumerate((t, s) for t in tasks for s in range(samples))}
    lines = sorted(
        (line for key, line in partial.lines.items() if key in order),
        key=lambda x: order[(x["task_id"], x["sample"])],
    )
    stats.wall_s = time.perf_counter() - t_start
    timing = {"wall_s": stats.wall_s, "model_s": stats.model_s, "samples": stats.samples}
    if extra_timing is not None:
        timing.update(extra_timing())
    if stages:
        pre = [partial.lines[(t.task_id, s)] for stage in stages for t in stage for s in range(samples)]
        n_failed = sum(line["status"] == "failed" for line in pre)
        timing.update(prerequisite_samples=len(pre), prerequisite_failed=n_failed)
        if n_failed:
            print(f"envace eval: {n_failed} of {len(pre)} prerequisite conversations ended abnormally (their "
                  f"memory is kept as it was, as bfcl-eval keeps it); see {prerequisite_path(out)}",
                  file=sys.stderr)
        write_results(prerequisite_path(out), pre, benchmark=adapter.name, seed=seed, started=partial.started,
                      timing={}, **manifest)
    raised = [line for line in lines if is_exception_result(line)]
    if raised:
        print(f"envace eval: {len(raised)} of {len(lines)} samples of {out} ended by an exception, not by "
              f"the model (counted as failed, marked extra.exception; first: {raised[0]['reason']})",
              file=sys.stderr)
    counts = {"failed": sum(line["status"] == "failed" for line in lines), "exceptions": len(raised)}
    path = write_results(out, lines, benchmark=adapter.name, seed=seed, started=partial.started,
                         timing=timing, counts=counts, **manifest)
    partial.remove()
    return path, stats
