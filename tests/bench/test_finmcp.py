"""FinMCP-Bench: loader on fixtures, replay cache, TP/TR/TF1 with hand-computed values."""

from __future__ import annotations

import asyncio
import json

import pytest

from envace.bench.finmcp import FinMcpAdapter, aggregate_metrics, load_samples, sample_metrics, tool_counts
from envace.bench.scripted import CharTokenizer, ScriptedBackend, script_for_calls
from envace.bench.selfcheck import REPLAY_CONFIG
from envace.core.environment import Services
from envace.core.episode import run_episode
from envace.core.tools import ToolCall


def test_metrics_by_hand():
    # pred {A:2, B:1}, gold {A:1, C:1}: TP = 1, FP = 2, FN = 1
    assert tool_counts(["A", "A", "B"], ["A", "C"]) == (1, 2, 1)
    m = sample_metrics(["A", "A", "B"], ["A", "C"])
    assert m["tp"] == pytest.approx(1 / 3) and m["tr"] == pytest.approx(1 / 2)
    assert m["tf1"] == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))  # = 0.4
    assert sample_metrics([], ["A"]) == {"tp": 0.0, "tr": 0.0, "tf1": 0.0}
    # macro averages per-sample values; micro pools the counts
    agg = aggregate_metrics([(1, 2, 1), (2, 0, 0)])
    assert agg["macro_tp"] == pytest.approx((1 / 3 + 1) / 2)
    assert agg["macro_tr"] == pytest.approx((1 / 2 + 1) / 2)
    assert agg["micro_tp"] == pytest.approx(3 / 5) and agg["micro_tr"] == pytest.approx(3 / 4)
    assert agg["micro_tf1"] == pytest.approx(2 * 0.6 * 0.75 / 1.35)


def test_loader_drops_error_samples_and_splits_by_task(finmcp_fixture):
    assert [s["id"] for s in load_samples(finmcp_fixture)] == [1, 2, 3]
    adapter = FinMcpAdapter({"data": str(finmcp_fixture)})
    assert [t.task_id for t in adapter.load_tasks(["all"], None)] == ["1", "2", "3"]
    assert [t.task_id for t in adapter.load_tasks(["multi_turn"], None)] == ["3"]
    assert len(adapter.load_tasks(["all"], 2)) == 2
    tools = {t["function"]["name"]: t for t in adapter.load_tasks(["all"], None)[1].tools}
    assert tools["GetNav"]["function"]["parameters"]["properties"] == {"code": {"type": "string"},
                                                                      "days": {"type": "integer"}}
    with pytest.raises(FileNotFoundError, match="benchmarks.finmcp.data"):
        FinMcpAdapter({"data": "/nonexistent.json"}).load_tasks(["all"], None)


def test_bad_data_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"id": 1}]))
    with pytest.raises(ValueError, match="lacks 'id' or 'messages'"):
        load_samples(bad)


def test_replay_cache(finmcp_fixture):
    adapter = FinMcpAdapter({"data": str(finmcp_fixture)})
    task = adapter.load_tasks(["all"], None)[1]
    ep = adapter.new_episode(task, 0, 0, Services())
    assert ep.step(ToolCall("GetFund", {"code": "B"})) == "fund B: bonds"  # matched by call id, not order
    assert ep.step(ToolCall("GetFund", {"code": "A"})) == "fund A: equities"
    assert ep.step(ToolCall("GetFund", {"code": "Z"})) == "fund B: bonds"  # other args: first output
    assert "unknown tool" in ep.step(ToolCall("Transfer", {}))
    s = ep.score()  # pred GetFund x3 + Transfer vs gold GetFund x2 + GetNav: TP 2, FP 2, FN 1
    assert (s.extra["TP"], s.extra["FP"], s.extra["FN"]) == (2, 2, 1)
    assert s.subscores["tp"] == pytest.approx(0.5) and s.subscores["tr"] == pytest.approx(2 / 3)


def test_gold_replay_through_the_runner_scores_one(finmcp_fixture):
    adapter = FinMcpAdapter({"data": str(finmcp_fixture)})
    for task in adapter.load_tasks(["all"], None):
        ep = adapter.new_episode(task, 0, 0, Services())
        backend = ScriptedBackend(script_for_calls(adapter.gold_turns(task)))
        result = asyncio.run(run_episode(task, ep, backend, CharTokenizer(), REPLAY_CONFIG))
        assert result["status"] == "ok" and result["score"] == 1.0
        assert result["subscores"] == {"tp": 1.0, "tr": 1.0, "tf1": 1.0}
    users = [m for m in result["trajectory"]["messages"] if m["role"] == "user"]
    assert [u["content"] for u in users] == ["What are my assets?", "And my risk level?"]
