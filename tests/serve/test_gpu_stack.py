"""The GPU cluster's stack (:mod:`envace.serve.gpu_stack`): the preflight's verdicts on a node's facts, and
(marker ``network``, ~2 min, PyPI only) the GPU install resolved again against what the module and
``environment.yml`` say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envace.serve.gpu_stack import CUDA_MAJOR, EXPECTED, MIN_DRIVER, preflight, version_tuple

ROOT = Path(__file__).resolve().parents[2]
OK = dict(EXPECTED)


def test_version_tuple():
    assert version_tuple("580.65.06") == (580, 65, 6)
    assert version_tuple("2.11.0+cu130") == (2, 11, 0)
    assert version_tuple("13.0") == (13, 0)


def test_a_node_as_the_install_resolves_passes():
    assert preflight("580.95.05", "13.0", True, OK) == []


def test_a_cuda_12_driver_under_the_cuda_13_build_is_named_with_what_to_do():
    (problem,) = preflight("535.183.01", "13.0", False, OK)
    assert "NVIDIA driver 535.183.01 is older than CUDA 13.0" in problem and "580.65.6" in problem
    assert "download.pytorch.org/whl/cu128" in problem
    # a CUDA 12 build on that driver is fine; on a too old one it names 12's floor
    assert preflight("535.183.01", "12.8", True, OK) == []
    (old,) = preflight("470.82.01", "12.8", False, OK)
    assert "update the NVIDIA driver to >= 525.60.13" in old


def test_cpu_build_missing_driver_and_other_versions_are_each_named():
    problems = preflight(None, None, False, {**OK, "vllm": "0.30.0", "verl": None})
    text = "\n".join(problems)
    assert "vllm 0.30.0 is installed, the GPU install resolves to 0.24.0" in text
    assert "verl is not installed" in text
    assert "no NVIDIA driver found" in text and "CPU build" in text
    assert len(problems) == 4


def test_a_driver_without_a_visible_device_is_a_problem():
    (problem,) = preflight("580.95.05", "13.0", False, OK)
    assert "CUDA_VISIBLE_DEVICES" in problem


def test_environment_yml_states_what_the_install_resolves_to():
    head = (ROOT / "environment.yml").read_text().split("name: envace")[0]
    assert f"CUDA {CUDA_MAJOR}" in head and "CUDA 12.x drivers" not in head
    assert f">= {'.'.join(map(str, MIN_DRIVER[CUDA_MAJOR]))}" in head.replace("580.65.06", "580.65.6")
    for name, version in EXPECTED.items():
        assert f"{name} {version}" in head, (name, version)


@pytest.mark.network
def test_the_gpu_install_resolves_as_documented(tmp_path):
    """``pip install --dry-run --report`` of ``.[gpu,bench]`` for this interpreter (Linux x86-64, Python
    3.11): verl, vLLM, torch and transformers at :data:`EXPECTED`, torch's CUDA toolkit at
    :data:`CUDA_MAJOR`."""
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                           "--quiet", "--report", str(report), ".[gpu,bench]"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    resolved = {i["metadata"]["name"].lower(): i["metadata"] for i in installs}
    assert {n: resolved[n]["version"] for n in EXPECTED} == EXPECTED
    toolkit = [d for d in resolved["torch"].get("requires_dist", []) if d.startswith("cuda-toolkit")]
    assert toolkit and f"=={CUDA_MAJOR}." in toolkit[0], toolkit
