"""Finished runs kept through a failed job: linked, restored only with the right hash, dropped after."""

from __future__ import annotations

from pathlib import Path

from envace.common import kept_results
from envace.common.results import manifest_path, read_results, write_results

HASH = "0123456789abcdef"
LINE = {"benchmark": "b", "split": "s", "task_id": "t0", "sample": 0, "seed": 0, "score": 1.0,
        "subscores": {}, "status": "ok", "reason": None}


def _finished(tmp_path: Path) -> Path:
    out = tmp_path / "eval" / "m" / "b" / "seed0.jsonl"
    return write_results(out, [LINE], model="m", benchmark="b", seed=0, scale="smoke", config_hash=HASH,
                         git_commit="x", package_versions={})


def test_a_kept_run_comes_back_after_its_outputs_were_deleted(tmp_path: Path) -> None:
    out = _finished(tmp_path)
    kept_results.add_to_manifest(out, {"serving": {"job": "j"}})
    kept_results.keep(out)
    text, manifest = out.read_text(), manifest_path(out).read_text()
    out.unlink()
    manifest_path(out).unlink()  # what Snakemake does to a failed job's outputs
    assert kept_results.restore(out, HASH)
    assert out.read_text() == text and manifest_path(out).read_text() == manifest
    assert read_results(out, expected_hash=HASH).manifest["serving"] == {"job": "j"}
    kept_results.drop(out)
    assert not (out.parent / ".done").exists() and out.exists()


def test_a_kept_run_of_another_config_is_dropped_not_restored(tmp_path: Path) -> None:
    out = _finished(tmp_path)
    kept_results.keep(out)
    out.unlink()
    assert not kept_results.restore(out, "0" * 16)
    assert not out.exists() and not (out.parent / ".done").exists()
    assert not kept_results.restore(out, HASH)  # nothing kept any more
