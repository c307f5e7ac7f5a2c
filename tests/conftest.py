"""Shared fixtures: the repository root, and the warm-started tiny model the real-server tests share.

The warm-started model is built by ``envace tiny-model`` (~2.5 min on 2 cores) into a cache folder,
``.cache/tests/tiny-<key>`` (``ENVACE_TEST_CACHE`` moves it), and each test session copies it. The key
hashes everything the build reads: its arguments (``config/smoke.yaml``'s ``tiny_model``), the warm-start
records, every file of the ``envace`` package and the torch/transformers versions; so a code change
rebuilds it, and CI's two pytest sessions (``make test``, then ``tests/slurm``) build it once.
"""

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("ENVACE_TEST_CACHE", ROOT / ".cache" / "tests"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


def _warm_args() -> list[str]:
    cfg = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    tiny = cfg["tiny_model"]
    return ["--seed", str(tiny["seed"]), "--warmstart-data", str(ROOT / cfg["training"]["data"]["source"]),
            "--warmstart-steps", str(tiny["warmstart_steps"]), "--warmstart-lr", str(tiny["warmstart_lr"])]


def _build_key(args: list[str]) -> str:
    h = hashlib.sha256("\0".join(args).encode())
    h.update(Path(args[args.index("--warmstart-data") + 1]).read_bytes())
    for path in sorted((ROOT / "envace").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    for dist in ("torch", "transformers"):
        h.update(f"{dist}=={importlib.metadata.version(dist)}".encode())
    return h.hexdigest()[:16]


def warm_tiny_model_build() -> Path:
    """The cached warm-started tiny model (built on a miss; the folder appears whole or not at all)."""
    args = _warm_args()
    cached = CACHE / f"tiny-{_build_key(args)}"
    if (cached / "done.json").is_file():
        return cached
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=CACHE, prefix=".building-"))
    argv = [str(Path(sys.executable).parent / "envace"), "tiny-model", "--out", str(tmp / "tiny"), *args]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    os.replace(tmp / "tiny", cached)
    shutil.rmtree(tmp, ignore_errors=True)
    return cached


@pytest.fixture(scope="session")
def warm_tiny_model(tmp_path_factory) -> Path:
    """The smoke model exactly as the smoke DAG builds it (``envace tiny-model`` with
    ``config/smoke.yaml``'s ``tiny_model`` warm start on the CM2 fixture records), a copy per session:
    the tests that run ``vllm serve`` / verl's ``main_ppo`` for real share it."""
    out = tmp_path_factory.mktemp("warm_tiny") / "tiny"
    shutil.copytree(warm_tiny_model_build(), out)
    return out
