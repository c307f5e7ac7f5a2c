"""Fixtures for the reporting tests: the example config/results and a CLI runner."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from envace.cli.main import run
from envace.common.config import eval_hash, load_config, tts_hash
from envace.common.results import eval_path, read_results, tts_path, write_results

DATA = Path(__file__).resolve().parents[1] / "data"
EXAMPLE_CONFIG = DATA / "example_config.yaml"
EXAMPLE_RESULTS = DATA / "example_results"


run_cli = run  # the envace CLI, exceptions propagating (envace.cli.run)


@pytest.fixture(scope="session")
def cfg() -> dict:
    return load_config(EXAMPLE_CONFIG)


@pytest.fixture
def results_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "results"
    shutil.copytree(EXAMPLE_RESULTS, dest)
    return dest


def example_lines(kind: str, name: str, bench: str, seed: int) -> list[dict]:
    path = (eval_path if kind == "eval" else tts_path)(EXAMPLE_RESULTS, name, bench, seed)
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def rewrite(cfg: dict) -> Callable[..., None]:
    """rewrite(results_dir, kind, name, bench, score): every seed's samples get ``score`` (valid manifest)."""

    def _rewrite(results_dir: Path, kind: str, name: str, bench: str, score: float) -> None:
        seeds = cfg["seeds"] if kind == "eval" else cfg["tts"]["seeds"]
        for seed in seeds:
            path = (eval_path if kind == "eval" else tts_path)(results_dir, name, bench, seed)
            old = read_results(path)
            lines = [{**line, "score": score, "status": "ok", "reason": None} for line in old.lines]
            expected = eval_hash(cfg, name, bench) if kind == "eval" else tts_hash(cfg, name, bench)
            write_results(
                path,
                lines,
                model=name,
                benchmark=bench,
                seed=seed,
                scale=cfg["scale"],
                config_hash=expected,
                git_commit="test",
                package_versions={},
            )

    return _rewrite
