"""Pinned CPU numerics of the warm start (envace.train.numerics, envace tiny-model): the same weights
whatever the job's thread count or the machine's widest kernels, and a clear error where the pins come
too late. Each case runs in a fresh process (the pins act before a library's first use)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENVACE = str(Path(sys.executable).parent / "envace")
X86 = platform.machine().lower() in ("x86_64", "amd64")


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_pin_fixes_threads_and_kernels():
    out = _python("import json; from envace.train.numerics import pin; print(json.dumps(pin(1)))",
                  OMP_NUM_THREADS="2", ATEN_CPU_CAPABILITY="default")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["threads"] == 1
    if X86:
        assert got["cpu_capability"] == "AVX2" and got["env"]["MKL_CBWR"] == "AVX2", got


@pytest.mark.skipif(not X86, reason="the kernel pins are x86-64's")
def test_pin_after_torch_chose_its_kernels_is_an_error():
    code = ("import torch; torch.ones(64) + 1\n"
            "from envace.train.numerics import NumericsError, pin\n"
            "try:\n    pin(1)\nexcept NumericsError as e:\n    print('refused:', e)\n")
    out = _python(code, ATEN_CPU_CAPABILITY="default")  # the kernels torch chose first: not AVX2
    assert out.returncode == 0 and out.stdout.startswith("refused: ATen already runs DEFAULT"), out


def _build(tmp: Path, name: str, threads_env: str) -> tuple[str, dict]:
    stages = [{"data": str(ROOT / "tests/data/cm2_fixture.jsonl"), "steps": 15, "lr": 1e-2}]
    out = tmp / name
    proc = subprocess.run([ENVACE, "tiny-model", "--out", str(out), "--seed", "0", "--threads", "2",
                           "--warmstart", json.dumps(stages)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": threads_env})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    return digest, json.loads((out / "done.json").read_text())


def test_the_warm_start_is_the_same_whatever_the_jobs_threads(tmp_path):
    """A job given 1 core and one given 2 build bit-identical weights (unpinned, 200 ledger steps
    differed: loss 0.282 with 2 threads, 0.289 with 1)."""
    one, done = _build(tmp_path, "one", "1")
    two, _ = _build(tmp_path, "two", "2")
    assert one == two
    assert done["numerics"]["threads"] == 2
