"""BFCL-v4 single-turn (AST) categories: loading, tool schemas, bfcl-eval's checker verdicts, gold replay."""

from __future__ import annotations

import asyncio
import sys

import pytest

from envace.bench import get_adapter
from envace.bench.bfcl.adapter import BfclMultiTurnAdapter, BfclV4Adapter
from envace.bench.bfcl.common import AST_SPLITS, bfcl_eval_package
from envace.bench.bfcl.single_turn import (
    OBSERVATION,
    BfclAstEpisode,
    _java,
    _js,
    ast_checker_module,
    gold_calls,
    score_calls,
)
from envace.bench.scripted import CharTokenizer, ScriptedBackend, script_for_calls
from envace.bench.selfcheck import REPLAY_CONFIG, selfcheck_bfcl_ast
from envace.core.environment import Services
from envace.core.episode import run_episode
from envace.core.tools import ToolCall


@pytest.fixture(scope="module", autouse=True)
def bfcl_project_root() -> None:
    bfcl_eval_package()  # bfcl-eval writes under BFCL_PROJECT_ROOT (a temp dir), never into site-packages


@pytest.fixture(scope="module")
def adapter() -> BfclV4Adapter:
    return BfclV4Adapter()


def _task(adapter, split, index=0):
    return adapter.load_tasks([split], index + 1)[index]


def _run(adapter, task, script):
    episode = adapter.new_episode(task, 0, 0, Services())
    return asyncio.run(run_episode(task, episode, ScriptedBackend(script), CharTokenizer(), REPLAY_CONFIG))


def test_loading_follows_bfcl_eval_order_and_data(adapter):
    from bfcl_eval.utils import load_dataset_entry

    for split in ("simple_python", "live_parallel", "live_relevance"):
        entries = load_dataset_entry(split, include_prereq=False, include_language_specific_hint=False)
        tasks = adapter.load_tasks([split], None)
        assert [t.task_id for t in tasks] == [e["id"] for e in entries]
        assert [t.tools[0]["function"]["name"] for t in tasks] == [e["function"][0]["name"] for e in entries]
    tasks = adapter.load_tasks(list(AST_SPLITS), 2)
    assert len(tasks) == 2 * len(AST_SPLITS) and {t.split for t in tasks} == set(AST_SPLITS)
    with_system = next(e for e in load_dataset_entry("live_simple", include_prereq=False)
                       if e["question"][0][0]["role"] == "system")
    task = next(t for t in adapter.load_tasks(["live_simple"], None) if t.task_id == with_system["id"])
    assert task.system == with_system["question"][0][0]["content"]
    assert task.first_user == with_system["question"][0][1]["content"]


def test_tool_schemas_per_language(adapter):
    py = _task(adapter, "simple_python")
    params = py.tools[0]["function"]["parameters"]
    assert params["type"] == "object" and "Python 3 syntax" in py.tools[0]["function"]["description"]
    floats = [t for t in adapter.load_tasks(["simple_python"], 40)
              if any(p.get("type") == "float" for f in t.meta["functions"]
                     for p in f["parameters"]["properties"].values())]
    name = next(n for f in floats[0].meta["functions"]
                for n, p in f["parameters"]["properties"].items() if p["type"] == "float")
    assert floats[0].tools[0]["function"]["parameters"]["properties"][name]["type"] == "number"
    for split, lang in (("simple_java", "Java"), ("simple_javascript", "JavaScript")):
        for task in adapter.load_tasks([split], 10):
            props = task.tools[0]["function"]["parameters"]["properties"]
            original = task.meta["functions"][0]["parameters"]["properties"]
            assert {p["type"] for p in props.values()} == {"string"}  # bfcl-eval's FC preprocessing
            for key, value in original.items():
                if value["type"] != "any":  # the checker keeps the language's own type names
                    assert f"This is {lang} {value['type']} type parameter" in props[key]["description"]
    java_types = {p["type"] for t in adapter.load_tasks(["simple_java"], None) for f in t.meta["functions"]
                  for p in f["parameters"]["properties"].values()}
    assert {"HashMap", "ArrayList", "long", "String"} <= java_types


def test_correct_call_passes_and_checker_handles_dotted_names(adapter):
    for split in ("simple_python", "simple_java", "simple_javascript", "parallel", "live_multiple"):
        task = _task(adapter, split)
        assert score_calls(task, gold_calls(task)).score == 1.0, split
    task = _task(adapter, "parallel")  # spotify.play x2: order does not matter
    assert "." in task.meta["functions"][0]["name"]
    assert score_calls(task, list(reversed(gold_calls(task)))).score == 1.0


def test_wrong_value_missing_argument_extra_call_unknown_function(adapter):
    task = _task(adapter, "simple_python")  # calculate_triangle_area(base=10, height=5)
    (gold,) = gold_calls(task)
    wrong = ToolCall(gold.name, {**gold.arguments, "base": gold.arguments["base"] + 1})
    score = score_calls(task, [wrong])
    assert score.score == 0.0 and score.extra["error_type"] == "value_error:others"
    missing = ToolCall(gold.name, {k: v for k, v in gold.arguments.items() if k != "height"})
    score = score_calls(task, [missing])
    assert score.score == 0.0 and score.extra["error_type"] == "simple_function_checker:missing_required"
    score = score_calls(task, [gold, gold])
    assert score.score == 0.0 and score.extra["error_type"] == "simple_function_checker:wrong_count"
    score = score_calls(task, [ToolCall("no_such_function", dict(gold.arguments))])
    assert score.score == 0.0 and score.extra["error_type"] == "simple_function_checker:wrong_func_name"
    assert score.extra["unknown_functions"] == ["no_such_function"]
    par = _task(adapter, "parallel")
    score = score_calls(par, gold_calls(par)[:1])
    assert score.extra["error_type"] == "parallel_function_checker_no_order:wrong_count"
    java = _task(adapter, "simple_java")
    raw = ToolCall(java.meta["functions"][0]["name"], {"controller": 1, "parent": "mapArea"})
    assert score_calls(java, [raw]).extra["error_type"] == "type_error:java"


def test_episode_records_calls_without_executing_them(adapter):
    task = _task(adapter, "simple_python")
    episode = adapter.new_episode(task, 0, 0, Services())
    assert isinstance(episode, BfclAstEpisode) and episode.max_act_turns == 1
    assert episode.step(ToolCall("__import__", {"name": "os"})) == OBSERVATION
    assert episode.user_reply("done") is None and len(episode.calls) == 1
    result = _run(adapter, task, script_for_calls([gold_calls(task)]))
    assert result["status"] == "ok" and result["score"] == 1.0 and result["extra"]["calls"] == 1
    tool_messages = [m for m in result["trajectory"]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == [OBSERVATION]


def test_malformed_output_is_a_failed_sample_not_a_crash(adapter):
    task = _task(adapter, "simple_python")
    bad = '<tool_call>\n{"name": "calculate_triangle_area", "arguments": {bad\n</tool_call>'
    result = _run(adapter, task, [bad])  # the runner may also mark it failed (act_parse_error)
    assert result["score"] == 0.0 and result["extra"]["error_type"] == "ast_decoder:decoder_failed"
    irrelevant = _task(adapter, "irrelevance")  # bfcl-eval: an undecodable output is "no call" = correct
    assert score_calls(irrelevant, [], decoded_ok=False).score == 1.0
    result = _run(adapter, task, script_for_calls([[ToolCall("unknown_fn", {"x": 1})]]))
    assert result["status"] == "ok" and result["score"] == 0.0
    assert result["extra"]["error_type"] == "simple_function_checker:wrong_func_name"


def test_relevance_and_irrelevance_rules(adapter):
    for split in ("irrelevance", "live_irrelevance"):
        task = _task(adapter, split)
        assert _run(adapter, task, ["I cannot help with that."])["score"] == 1.0
        call = ToolCall(task.meta["functions"][0]["name"], {})
        result = _run(adapter, task, script_for_calls([[call]]))
        assert result["score"] == 0.0 and result["extra"]["error_type"] == "irrelevance_error:decoder_success"
    task = _task(adapter, "live_relevance")
    result = _run(adapter, task, ["No call."])
    assert result["score"] == 0.0 and result["extra"]["error_type"] == "relevance_error:decoder_failed"
    assert _run(adapter, task, script_for_calls([gold_calls(task)]))["score"] == 1.0
    assert score_calls(task, [], decoded_ok=False).extra["error_type"] == "relevance_error:decoder_failed"


def test_gold_encoders_round_trip_through_bfcl_converters():
    from bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter import java_type_converter
    from bfcl_eval.eval_checker.ast_eval.type_convertor.js_type_converter import js_type_converter

    java_cases = [(True, "boolean", None), (7, "integer", None), (9_000_000_000, "long", None),
                  (2.5, "float", None), (0.001, "double", None), ([1, 2], "Array", "integer"),
                  (["a", "b"], "Array", "String"), (["x y", "z"], "ArrayList", "String"),
                  ([3, 4], "ArrayList", "long"), ({"limit": 50, "on": True, "s": "p"}, "HashMap", None)]
    for value, kind, item in java_cases:
        assert java_type_converter(_java(value, kind, item), kind, item) == value, (value, kind)
    js_cases = [(True, "Boolean"), (3, "integer"), (1.25, "float"), (12, "Bigint"), ("abc", "String"),
                ([1, 2, 3], "array"), ({"a": 1, "b": "x"}, "dict")]
    for value, kind in js_cases:
        assert js_type_converter(_js(value, kind), kind) == value, (value, kind)


def test_checker_import_leaves_no_stand_in_behind():
    module = ast_checker_module()
    assert hasattr(module, "ast_checker")
    config = sys.modules.get("bfcl_eval.constants.model_config")
    assert config is None or getattr(config, "__file__", None)  # never our stand-in module


def test_selfcheck_few_tasks_per_category():
    passed, total, failed, by_split = selfcheck_bfcl_ast(limit=3)
    assert total == 3 * len(AST_SPLITS) and passed == total, failed[:2]
    assert by_split == {split: (3, 3) for split in AST_SPLITS}


def test_unsupported_categories_are_named():
    with pytest.raises(ValueError, match="unknown BFCL category"):
        get_adapter("bfcl_v4").load_tasks(["format_sensitivity"], 1)
    with pytest.raises(ValueError, match="agentic category: run it with benchmark bfcl_v4"):
        BfclMultiTurnAdapter().load_tasks(["memory_kv"], 1)
    with pytest.raises(ValueError, match="bfcl_v4"):
        BfclMultiTurnAdapter().load_tasks(["simple_python"], 1)
    assert "bfcl_ast_checker" in get_adapter("bfcl_v4").versions()


def test_selfcheck_command_prints_every_category(capsys):
    from envace.cli.main import main

    assert main(["selfcheck", "bfcl_ast", "--limit", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [f"{split}: 1/1" for split in AST_SPLITS] + [f"{len(AST_SPLITS)}/{len(AST_SPLITS)}"]


def test_known_unsatisfiable_tasks_fail_their_gold_replay(adapter):
    from envace.bench.bfcl.single_turn import KNOWN_UNSATISFIABLE

    splits = sorted({task_id.rsplit("_", 1)[0] for task_id in KNOWN_UNSATISFIABLE})
    tasks = [t for t in adapter.load_tasks(splits, None) if t.task_id in KNOWN_UNSATISFIABLE]
    assert len(tasks) == len(KNOWN_UNSATISFIABLE)
    for task in tasks:
        assert score_calls(task, gold_calls(task)).score == 0.0, task.task_id
