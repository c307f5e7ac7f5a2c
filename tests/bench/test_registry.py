"""The adapter registry (envace.bench): lazy loading by import path, constructor keyword filtering."""

from __future__ import annotations

import pytest

from envace import bench


def test_registry_names_the_protocol_paths():
    assert bench.REGISTRY["tau2"] == "envace.bench.tau2.adapter:Tau2Adapter"
    assert bench.REGISTRY["vitabench"] == "envace.bench.vitabench.adapter:VitaBenchAdapter"
    assert {"bfcl_v4", "bfcl_multi_turn", "finmcp"} <= set(bench.REGISTRY)


def test_get_adapter_passes_only_accepted_keywords(monkeypatch):
    monkeypatch.setitem(bench.REGISTRY, "x1", "envace.bench.finmcp:FinMcpAdapter")
    adapter = bench.get_adapter("x1", config={"data": "d.json"}, work_dir="/tmp/w")
    assert str(adapter.data) == "d.json"
    monkeypatch.setitem(bench.REGISTRY, "x2", "envace.bench.no_such_module:A")
    with pytest.raises(ValueError, match="cannot import"):
        bench.get_adapter("x2")
