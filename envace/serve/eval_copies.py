"""Evaluations a job would run twice: the same weights, benchmark, seed and settings under two model ids.

At smoke scale several of the paper's models are the one tiny model (``config/smoke.yaml``: Qwen3-8B,
AWM-8B and EnvScaler-8B are all ``models/smoke/tiny``), so one evaluation job's plan can hold the same
evaluation under several ids, and their result files were identical line for line. ``envace eval``
runs it once (:func:`find_copies`, keyed by :func:`envace.common.config.weights_eval_hash`) and writes
the others as copies (:func:`write_copy`): the same JSONL, and the source's manifest with the copy's
own model id and config hash, ``copied_from`` naming the file it copies and no ``timing`` (the copy
ran nothing). At paper scale every model has its own weights and nothing is copied. Test-time-scaling
runs are never copied (their setting, not a weights path, names their models).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from envace.common.atomic import atomic_write_bytes, atomic_write_json
from envace.common.config import weights_eval_hash
from envace.common.results import manifest_path, read_manifest

__all__ = ["Copy", "find_copies", "write_copy"]


class _Run(Protocol):
    setting: str | None
    benchmark: str
    seed: int
    out: Path
    config_hash: str


@dataclass(frozen=True)
class Copy:
    """A run of the job whose result file is ``source``'s, under ``model``."""

    run: _Run
    source: _Run
    model: str


def find_copies(cfg: dict[str, Any], runs: Iterable[tuple[str, str, _Run]],
                todo: Iterable[_Run]) -> list[Copy]:
    """Each run of ``todo`` that an earlier run of the job (``runs``, in job order, as ``(model id,
    weights path, run)``) already evaluates: the same weights, benchmark, seed and evaluation settings.
    The earlier run may be one this attempt restored; plain evaluations only."""
    pending = {id(r) for r in todo}
    first: dict[str, _Run] = {}
    copies = []
    for model, weights, run in runs:
        if run.setting is not None:
            continue
        key = weights_eval_hash(cfg, model, weights, run.benchmark, run.seed)
        if key not in first:
            first[key] = run
        elif id(run) in pending:
            copies.append(Copy(run, first[key], model))
    return copies


def write_copy(copy: Copy) -> None:
    """Write ``copy.run.out`` as a copy of its source's complete result file (the JSONL first, then the
    manifest, each to a temp file renamed over the target, as :func:`envace.common.results.write_results`
    does); :class:`envace.common.results.IncompleteResultsError` if the source is not complete."""
    source, out = copy.source.out, copy.run.out
    manifest = read_manifest(source)
    manifest.pop("timing", None)
    manifest.update(model=copy.model, config_hash=copy.run.config_hash, copied_from=str(source))
    manifest_path(out).unlink(missing_ok=True)
    atomic_write_bytes(out, Path(source).read_bytes(), parents=True)
    atomic_write_json(manifest_path(out), manifest, indent=2, sort_keys=True)
