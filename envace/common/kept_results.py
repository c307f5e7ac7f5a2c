"""Finished result files kept beside their run folder, so a failed job does not redo finished runs.

Snakemake deletes *all* outputs of a failed job, including the runs it had finished. An evaluation job
therefore hard-links each finished result file and its manifest into ``<run dir>/.done/`` (:func:`keep`);
a later attempt brings a run back from there (:func:`restore`, only with the expected config hash) instead
of running it again, and the links are removed when the job finishes (:func:`drop`). Links, not copies: a
kept file costs no space and is the same inode the finished run wrote.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from envace.common.atomic import atomic_write_json
from envace.common.results import ResultsError, manifest_path, read_results

__all__ = ["keep", "restore", "drop", "add_to_manifest"]


def _kept(out: Path) -> Path:
    return out.parent / ".done" / out.name


def keep(out: Path) -> None:
    """Hard-link the finished result file ``out`` and its manifest into ``.done/``."""
    kept = _kept(out)
    kept.parent.mkdir(exist_ok=True)
    for src, dst in ((manifest_path(out), manifest_path(kept)), (out, kept)):
        dst.unlink(missing_ok=True)
        os.link(src, dst)


def restore(out: Path, config_hash: str) -> bool:
    """Bring back ``out`` from ``.done/`` if a complete file with ``config_hash`` is kept there (each file
    linked to a temp name, then renamed over ``out``); a kept file that does not read back is dropped."""
    kept = _kept(out)
    if not kept.exists():
        return False
    try:
        read_results(kept, expected_hash=config_hash)
    except (ResultsError, OSError):
        drop(out)
        return False
    for src, dst in ((kept, out), (manifest_path(kept), manifest_path(out))):
        tmp = dst.with_name(f".{dst.name}.restore")
        tmp.unlink(missing_ok=True)
        os.link(src, tmp)
        os.replace(tmp, dst)
    return True


def drop(out: Path) -> None:
    """Remove ``out``'s kept links (and ``.done/`` once empty)."""
    kept = _kept(out)
    kept.unlink(missing_ok=True)
    manifest_path(kept).unlink(missing_ok=True)
    try:
        kept.parent.rmdir()
    except OSError:
        pass


def add_to_manifest(out: Path, extra: dict[str, Any]) -> None:
    """Add keys to a finished run's manifest (temp file + rename, written as ``write_results`` writes)."""
    path = manifest_path(out)
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest.update(extra)
    atomic_write_json(path, manifest, indent=2, sort_keys=True)
