"""Benchmark adapters, registered by import path and loaded lazily (see :mod:`envace.core.environment`).

``get_adapter(name, **kwargs)`` imports ``module:Class`` from :data:`REGISTRY` only when asked, so a
benchmark whose package is missing fails with a clear error only when it is used.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from envace.core.environment import BenchmarkAdapter

__all__ = ["REGISTRY", "get_adapter"]

#: benchmark name (config ``benchmarks.<name>``) -> ``"module:Class"`` of its adapter.
REGISTRY: dict[str, str] = {
    "bfcl_v4": "envace.bench.bfcl.adapter:BfclV4Adapter",
    "bfcl_multi_turn": "envace.bench.bfcl.adapter:BfclMultiTurnAdapter",
    "tau2": "envace.bench.tau2.adapter:Tau2Adapter",
    "vitabench": "envace.bench.vitabench.adapter:VitaBenchAdapter",
    "finmcp": "envace.bench.finmcp:FinMcpAdapter",
    "ledger": "envace.bench.ledger:LedgerAdapter",  # ours, not a paper benchmark (smoke scale)
}


def get_adapter(name: str, **kwargs: Any) -> BenchmarkAdapter:
    """Instantiate the adapter registered under ``name``.

    The runner passes ``config=`` (the ``benchmarks.<name>`` config section, a dict) and ``work_dir=``
    (a scratch directory for the run). An adapter whose constructor has no ``config`` parameter gets the
    section's keys as keyword arguments instead. Keyword arguments the constructor does not accept are
    dropped, so an adapter may take none, some or all of them.
    """
    if name not in REGISTRY:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(REGISTRY))}")
    module_name, _, class_name = REGISTRY[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"benchmark {name!r}: cannot import its adapter {module_name}: {exc}") from exc
    cls = getattr(module, class_name)
    params = inspect.signature(cls).parameters
    if "config" not in params and "config" in kwargs:  # an adapter configured by keywords: spread the section
        kwargs = {**(kwargs.pop("config") or {}), **kwargs}
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return cls(**kwargs)
