"""envace.common.results: round trip and every kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.common.results import (
    IncompleteResultsError,
    ResultsError,
    eval_path,
    manifest_path,
    read_results,
    write_results,
)

HASH = "0123456789abcdef"


def line(task: str, sample: int = 0, score: float = 1.0, **kw: object) -> dict:
    return {
        "benchmark": "tau2",
        "split": "airline",
        "task_id": task,
        "sample": sample,
        "seed": 0,
        "score": score,
        "subscores": {},
        "status": "ok",
        "reason": None,
        **kw,
    }


def write(path: Path, lines: list[dict]) -> Path:
    return write_results(
        path,
        lines,
        model="m",
        benchmark="tau2",
        seed=0,
        scale="smoke",
        config_hash=HASH,
        git_commit="abc",
        package_versions={"numpy": "2"},
    )


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return write(
        eval_path(tmp_path, "m", "tau2", 0), [line("a"), line("a", 1, 0.0), line("b", trajectory=[])]
    )


def test_round_trip_and_layout(path: Path, tmp_path: Path) -> None:
    assert path == tmp_path / "eval" / "m" / "tau2" / "seed0.jsonl"
    res = read_results(path, expected_hash=HASH)
    assert res.manifest["complete"] and res.manifest["n_samples"] == 3
    assert [x["task_id"] for x in res.lines] == ["a", "a", "b"]
    assert manifest_path(path).name == "seed0.manifest.json"


def test_truncated_line_names_file_and_line(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) - 20] + "\n")
    with pytest.raises(ResultsError, match=r"seed0\.jsonl: line 3: invalid or truncated JSON"):
        read_results(path)
    path.write_text(text[:-1])
    with pytest.raises(ResultsError, match="line 3: truncated line"):
        read_results(path)


def test_nan_score_is_an_error(path: Path) -> None:
    rows = path.read_text().splitlines()
    rows[1] = rows[1].replace('"score": 0.0', '"score": NaN')
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(ResultsError, match="line 2: non-finite number NaN"):
        read_results(path)
    with pytest.raises(ResultsError, match="not JSON compliant|Out of range float"):
        write(path, [line("a", score=float("nan"))])


def test_hash_mismatch_names_both_hashes(path: Path) -> None:
    with pytest.raises(ResultsError, match=f"manifest has {HASH}.*expects fedcba9876543210"):
        read_results(path, expected_hash="fedcba9876543210")


def test_duplicate_and_schema_errors(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="duplicate"):
        write(tmp_path / "x.jsonl", [line("a"), line("a")])
    with pytest.raises(ResultsError, match="1.5 is greater than the maximum"):
        write(tmp_path / "x.jsonl", [line("a", score=1.5)])
    with pytest.raises(ResultsError, match="seed=0"):
        write(tmp_path / "x.jsonl", [line("a", seed=3)])
    assert not (tmp_path / "x.jsonl").exists()


def test_partial_files_are_never_complete(path: Path) -> None:
    m = manifest_path(path)
    manifest = json.loads(m.read_text())
    m.write_text(json.dumps({**manifest, "complete": False}))
    with pytest.raises(IncompleteResultsError, match="complete=false"):
        read_results(path)
    m.unlink()
    with pytest.raises(IncompleteResultsError, match="no manifest"):
        read_results(path)
    with pytest.raises(IncompleteResultsError, match="does not exist"):
        read_results(path.with_name("seed9.jsonl"))


def test_sample_count_must_match_manifest(path: Path) -> None:
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:2]))
    with pytest.raises(ResultsError, match="has 2 lines but its manifest says n_samples=3"):
        read_results(path)


def test_manifests_fingerprint_the_whole_install_and_the_cpu(tmp_path, monkeypatch) -> None:
    """Every manifest says which install and CPU its numbers came from (the same code and weights scored
    19.1 and 39.5 on two set-ups): the digest covers every distribution, not only the pinned ones."""
    from importlib import metadata

    from envace.common import results

    path = write_results(tmp_path / "r.jsonl", [line("a")], model="m", benchmark="tau2", seed=0,
                         scale="smoke", config_hash=HASH)
    versions = json.loads(manifest_path(path).read_text())["package_versions"]
    digest, count = versions["environment"].split(" ", 1)
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert count == f"({len({d.metadata['Name'].lower() for d in metadata.distributions()})} distributions)"
    assert versions["cpu"].split()[0] and versions["numpy"]

    class Dist:  # one transitive dependency moved: another digest
        def __init__(self, name: str, version: str) -> None:
            self.metadata, self.version = {"Name": name}, version

    def fingerprint(dists: list) -> str:
        results.environment_fingerprint.cache_clear()
        monkeypatch.setattr(results.metadata, "distributions", lambda: dists)
        return results.environment_fingerprint()["environment"]

    try:
        before = fingerprint([Dist("a", "1.0"), Dist("B", "2.0")])
        assert fingerprint([Dist("b", "2.0"), Dist("A", "1.0")]) == before  # order and case: the same
        assert fingerprint([Dist("a", "1.0"), Dist("b", "2.1")]) != before
    finally:
        results.environment_fingerprint.cache_clear()
