"""Shared fixtures: the repository root, and the warm-started tiny model the real-server tests share;
``tests/fixtures.py`` (registered below) adds the tiny ``tokenizer``, ``scripted`` backends and the
weather tool.

The warm-started model is built by ``envace tiny-model --cache`` (~2.5 min on 2 cores) in its build cache,
``.cache/tiny-model/tiny-<key>`` (``ENVACE_TINY_MODEL_CACHE`` moves it; the key hashes everything the build
reads, see :mod:`envace.cli.tiny_model`), and each test session copies it: a code change rebuilds
it, and one CI run (``make test``, then the smoke DAG) builds it once.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("ENVACE_TINY_MODEL_CACHE") or ROOT / ".cache" / "tiny-model")

pytest_plugins = ["tests.fixtures"]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


def _warm_args() -> list[str]:
    cfg = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    tiny = cfg["tiny_model"]
    stages = [{**stage, "data": str(ROOT / stage["data"])} for stage in tiny["warmstart"]]
    return ["--seed", str(tiny["seed"]), "--warmstart", json.dumps(stages)]


@pytest.fixture(scope="session")
def warm_tiny_model(tmp_path_factory) -> Path:
    """The smoke model exactly as the smoke DAG builds it (``envace tiny-model`` with
    ``config/smoke.yaml``'s ``tiny_model`` warm start on the CM2 fixture records), a copy per session
    from the build cache (trained on a miss): the tests that run ``vllm serve`` / verl's ``main_ppo`` for
    real share it."""
    out = tmp_path_factory.mktemp("warm_tiny") / "tiny"
    argv = [str(Path(sys.executable).parent / "envace"), "tiny-model", "--out", str(out),
            "--cache", str(CACHE), *_warm_args()]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out


#: markers whose tests run only when a ``-m`` expression names them
OPT_IN = ("learning", "network", "two_nodes")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ledger learning test (``tests/learning``, marker ``learning``, ~60 min), the tests that
    resolve installs on PyPI (marker ``network``, minutes) and the two-node trainings (``tests/cluster``,
    marker ``two_nodes``: a two-node Slurm on this machine, ~16 min) run only when a ``-m`` expression
    names their marker (``pytest -m learning tests/learning``, ``pytest -m network``, ``pytest -m
    two_nodes tests/cluster``): ``pytest`` (``make test``), ``-m slow`` and ``-m "not slow"`` leave them
    out. The tests marked ``slow`` go first, in their collected order (today one: the per-role guard's
    ``main_ppo`` run, the suite's longest item): under ``pytest -n 2 --dist worksteal`` (``make test``) it
    starts at once and the other worker takes the short tests, instead of it starting last while the
    other worker idles."""
    named = config.getoption("markexpr") or ""
    skipped = [m for m in OPT_IN if m not in named]
    dropped = [item for item in items if any(m in item.keywords for m in skipped)]
    if dropped:
        items[:] = [item for item in items if item not in dropped]
        config.hook.pytest_deselected(items=dropped)
    items.sort(key=lambda item: "slow" not in item.keywords)  # stable: the collected order otherwise
