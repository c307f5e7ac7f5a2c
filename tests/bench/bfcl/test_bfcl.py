"""BFCL-v4 multi-turn adapter: structured dispatch, isolation, scoring by bfcl-eval's checkers."""

from __future__ import annotations

import asyncio

import pytest

from envace.bench import get_adapter
from envace.bench.bfcl.adapter import BfclMultiTurnAdapter
from envace.bench.bfcl.common import parse_gold_call, to_openai_tool
from envace.bench.scripted import CharTokenizer, ScriptedBackend, script_for_calls
from envace.bench.selfcheck import REPLAY_CONFIG, selfcheck_bfcl_multi_turn
from envace.core.environment import Services
from envace.core.episode import run_episode
from envace.core.tools import ToolCall


@pytest.fixture(scope="module")
def adapter() -> BfclMultiTurnAdapter:
    return BfclMultiTurnAdapter()


def _replay(adapter, task, turns):
    episode = adapter.new_episode(task, 0, 0, Services())
    backend = ScriptedBackend(script_for_calls(turns))
    return asyncio.run(run_episode(task, episode, backend, CharTokenizer(), REPLAY_CONFIG)), episode


def test_gold_replay_passes_on_every_category():
    passed, total, failed = selfcheck_bfcl_multi_turn(limit=6)
    assert total == 24 and passed == total, failed[:2]


def test_wrong_or_missing_calls_fail_with_the_checkers_error(adapter):
    task = adapter.load_tasks(["multi_turn_base"], 1)[0]
    gold = adapter.gold_turns(task)
    result, _ = _replay(adapter, task, [[]] + gold[1:])
    assert result["score"] == 0.0 and result["extra"]["error_type"] == "multi_turn:empty_turn_model_response"
    first = gold[0][0]
    changed = ToolCall(first.name, {k: f"{v}_x" for k, v in first.arguments.items()})
    wrong = [[changed] + gold[0][1:]] + gold[1:]
    result, _ = _replay(adapter, task, wrong)
    assert result["score"] == 0.0 and result["extra"]["error_type"].startswith("multi_turn:")


def test_dispatch_is_a_whitelist_and_never_evaluates_text(adapter):
    task = adapter.load_tasks(["multi_turn_base"], 1)[0]
    ep = adapter.new_episode(task, 0, 0, Services())
    assert "not defined" in ep.step(ToolCall("_load_scenario", {"scenario": {}}))
    assert "not defined" in ep.step(ToolCall("__import__", {"name": "os"}))
    assert ep.step(ToolCall("ls", {"bogus": 1})).startswith("Error during execution:")
    assert "name 'exit' is not defined" in ep.step(ToolCall("exit", {}))
    with pytest.raises(ValueError):
        parse_gold_call("cd(folder=__import__('os').getcwd())")
    with pytest.raises(ValueError):
        parse_gold_call("os.system('ls')")


def test_episodes_are_isolated(adapter):
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import _compare_instances

    task = adapter.load_tasks(["multi_turn_base"], 1)[0]
    _, used = _replay(adapter, task, adapter.gold_turns(task))
    fresh = [adapter.new_episode(task, s, 0, Services()).model.instances for s in (1, 2)]
    for name in used.model.instances:
        assert _compare_instances(fresh[0][name], fresh[1][name])[0]
    assert not all(_compare_instances(used.model.instances[n], fresh[0][n])[0] for n in used.model.instances)


def test_miss_func_adds_the_held_out_function_at_its_turn(adapter):
    task = adapter.load_tasks(["multi_turn_miss_func"], 1)[0]
    (turn, docs), = task.meta["holdout"].items()
    held = {d["name"] for d in docs}
    names = lambda tools: {t["function"]["name"] for t in tools}  # noqa: E731
    assert not held & names(task.tools)
    ep = adapter.new_episode(task, 0, 0, Services())
    for _ in range(int(turn)):
        reply = ep.user_reply("ok")
    assert reply.startswith("I have updated some more functions") and held <= names(ep.current_tools())


def test_schema_conversion_and_unsupported_splits(adapter):
    tool = to_openai_tool({"name": "f", "description": "d", "parameters": {"type": "dict", "properties": {
        "x": {"type": "float"}, "t": {"type": "tuple", "items": {"type": "integer"}}, "a": {"type": "any"}}}})
    params = tool["function"]["parameters"]
    assert params["type"] == "object" and params["properties"]["x"]["type"] == "number"
    assert params["properties"]["t"]["type"] == "array" and "type" not in params["properties"]["a"]
    with pytest.raises(ValueError, match="single-turn"):
        adapter.load_tasks(["simple_python"], 1)
    with pytest.raises(ValueError, match="agentic category: run it with benchmark bfcl_v4"):
        adapter.load_tasks(["web_search_base"], 1)
    with pytest.raises(ValueError, match="unknown BFCL category"):
        get_adapter("bfcl_v4").load_tasks(["memory_lru"], 1)
    with pytest.raises(ValueError, match="unknown benchmark"):
        get_adapter("nope")
