"""Rehearsal fidelity (envace.core.fidelity and `envace fidelity`): pair extraction, hand-computed metrics,
teacher-forced prompts, task-level aggregation, and the command end to end with the tiny model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from envace.cli.main import main
from envace.common.results import write_results
from envace.core.fidelity import (
    CallPair,
    PairScore,
    aggregate,
    extract_pairs,
    field_f1,
    is_error_value,
    json_equal,
    paired_difference,
    pairs_from_line,
    predict_observations,
    score_pair,
)
from envace.core.tools import ToolCall
from envace.serve.tiny_model import build_tiny_model
from tests.fixtures import WEATHER_TOOL, ScriptedBackend

CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a weather assistant."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
    ]},
    {"role": "tool", "name": "get_weather", "content": '{"temperature": 18}'},
    {"role": "tool", "name": "get_weather", "content": "Error: ROME-IS-CLOSED"},
    {"role": "assistant", "content": "garbled turn"},
    {"role": "tool", "content": '{"error": "INVALID_TOOL_CALL_FORMAT", "message": "x"}'},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": "[1]"}},
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
    ]},
    {"role": "tool", "name": "get_weather", "content": "{}"},
]


def test_extract_pairs():
    pairs, skipped = extract_pairs(CHAT)
    assert [(p.call, p.observation) for p in pairs] == [
        (ToolCall("get_weather", {"city": "Paris"}), '{"temperature": 18}'),
        (ToolCall("get_weather", {"city": "Rome"}), "Error: ROME-IS-CLOSED"),
    ]
    first, second = pairs
    assert first.history == CHAT[:2] and first.earlier == []
    assert second.earlier == [(ToolCall("get_weather", {"city": "Paris"}), '{"temperature": 18}')]
    assert first.caller_text.startswith("Let me check.\n<tool_call>")
    # unparsable-turn answer, bad arguments, and a call the episode never answered
    assert skipped == {"no_call": 1, "bad_arguments": 1, "no_observation": 1}


def test_pairs_from_line_needs_messages_and_tools():
    line = {"task_id": "t1", "sample": 2, "split": "base", "trajectory": {"messages": CHAT, "tools": []}}
    pairs, tools, _ = pairs_from_line(line)
    assert [(p.task_id, p.sample, p.split) for p in pairs] == [("t1", 2, "base")] * 2 and tools == []
    # the runner's record has no tools: they come from the caller (the benchmark adapter's task)
    runner_line = {**line, "trajectory": {"messages": CHAT, "terminations": ["final_answer"], "act_turns": 2}}
    assert pairs_from_line(runner_line, tools=[WEATHER_TOOL])[1] == [WEATHER_TOOL]
    with pytest.raises(ValueError, match="f.jsonl: line 3: the trajectory has no 'tools'"):
        pairs_from_line(runner_line, "f.jsonl: line 3")
    with pytest.raises(ValueError, match="f.jsonl: line 3: 'trajectory' must be an object"):
        pairs_from_line({"trajectory": [CHAT]}, "f.jsonl: line 3")


def test_json_rules():
    assert json_equal({"a": [1, 2.0]}, {"a": [1.0, 2]})
    assert not json_equal(True, 1) and not json_equal([1, 2], [2, 1])
    assert not json_equal({"a": 1}, {"a": 1, "b": 2})
    assert is_error_value({"error": "boom"}) and is_error_value("Error: no such order")
    assert not is_error_value({"error": None}) and not is_error_value("fine") and not is_error_value([])
    # pred leaves {a=1, b.c=2}; real leaves {a=1, b.c=3, d=4}: P = 1/2, R = 1/3, F1 = 2PR/(P+R) = 0.4
    assert field_f1({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}, "d": 4}) == pytest.approx(0.4)
    assert field_f1({}, {}) == 1.0 and field_f1([], {}) == 0.0 and field_f1("x", "x") == 1.0
    assert field_f1([1, 2], [1, 3, 4]) == pytest.approx(2 * (1 / 2) * (1 / 3) / (1 / 2 + 1 / 3))


def _pair(observation: str) -> CallPair:
    call = ToolCall("get_weather", {"city": "Paris"})
    return CallPair("get_weather", call, observation, [], "", [], "t", 0)


def test_score_pair():
    s = score_pair(_pair('{"temperature": 18}'), '<execution_result>{"temperature": 18.0}</execution_result>')
    assert (s.real_kind, s.pred_kind, s.agree, s.exact, s.field_f1) == ("success", "success", 1, 1, 1)
    s = score_pair(_pair('{"temperature": 18, "unit": "c"}'),
                   '<think>x</think><execution_result>{"temperature": 20, "unit": "c"}</execution_result>')
    assert (s.agree, s.exact, s.field_f1) == (1.0, 0.0, 0.5)
    code = '<execution_result>{"error": "INVALID_PARAMETERS", "message": "m"}</execution_result>'
    s = score_pair(_pair('{"temperature": 18}'), code)
    assert (s.real_kind, s.pred_kind, s.agree, s.exact, s.field_f1) == ("success", "error", 0, 0, 0)
    s = score_pair(_pair("Error: city not found"), code)
    assert (s.real_kind, s.pred_kind, s.agree, s.exact) == ("error", "error", 1, 0)
    s = score_pair(_pair('{"ok": true}'), "no block at all")
    assert (s.pred_kind, s.agree, s.exact, s.field_f1) == ("malformed", 0, 0, 0)
    s = score_pair(_pair('{"ok": true}'), None)
    assert (s.pred_kind, s.agree) == ("skipped", 0)


def test_predict_observations_is_teacher_forced(tokenizer):
    pairs, _ = extract_pairs(CHAT)
    backend = ScriptedBackend(tokenizer, ['<execution_result>{"t": 1}</execution_result>'] * 2)
    preds = asyncio.run(predict_observations(pairs, [[WEATHER_TOOL]] * 2, backend, tokenizer,
                                             sampling={"temperature": 0.0, "max_tokens": 32}))
    assert preds == ['<execution_result>{"t": 1}</execution_result>'] * 2
    first, second = backend.prompts
    assert "Weather in Paris and Rome?" in first and '"city": "Paris"' in first
    assert "temperature" not in first
    # the second call of the turn sees the first call's REAL observation, not the model's prediction
    assert '{"temperature": 18}' in second and '"city": "Rome"' in second
    assert "ROME-IS-CLOSED" not in second
    assert backend.params[0] == {"temperature": 0.0, "max_tokens": 32}
    too_long = asyncio.run(predict_observations(pairs[:1], [[WEATHER_TOOL]], backend, tokenizer,
                                                sampling={"max_tokens": 32}, max_context_tokens=40))
    assert too_long == [None] and len(backend.prompts) == 2


def test_predict_observations_shows_references_only_when_given(tokenizer):
    pairs, _ = extract_pairs(CHAT)
    backend = ScriptedBackend(tokenizer, ['<execution_result>{"t": 1}</execution_result>'] * 3)
    ref = {"call": {"name": "get_weather", "arguments": {"city": "Oslo"}}, "response": "REFERENCE-SNOW"}
    asyncio.run(predict_observations(pairs, [[WEATHER_TOOL]] * 2, backend, tokenizer,
                                     sampling={"max_tokens": 32}, references=[[ref], []]))
    asyncio.run(predict_observations(pairs[:1], [[WEATHER_TOOL]], backend, tokenizer,
                                     sampling={"max_tokens": 32}))
    with_ref, without, default = backend.prompts
    assert "REFERENCE-SNOW" in with_ref and "REFERENCE-SNOW" not in without + default
    with pytest.raises(ValueError, match="one tool list"):
        asyncio.run(predict_observations(pairs, [[WEATHER_TOOL]] * 2, backend, tokenizer, sampling={},
                                         references=[[ref]]))


def test_aggregate_is_task_level():
    def s(task: str, tool: str, agree: float) -> PairScore:
        return PairScore(task, 0, "x", tool, "success", "success", agree, 0.0, agree)

    scores = [s("a", "f", 1.0), s("a", "g", 0.0), s("b", "f", 1.0)]
    out = aggregate(scores, resamples=500, seed=1)
    overall = out["overall"]
    assert overall["agree"]["point"] == pytest.approx(0.75)  # task means 0.5 and 1.0
    assert overall["agree"]["micro"] == pytest.approx(2 / 3)
    assert overall["agree"]["ci_low"] <= 0.75 <= overall["agree"]["ci_high"]
    assert 0.5 <= overall["agree"]["ci_low"] and overall["agree"]["ci_high"] <= 1.0
    assert overall["exact"]["degenerate"] and overall["exact"]["point"] == 0.0
    assert (overall["n_pairs"], overall["n_tasks"]) == (3, 2)
    assert out["per_tool"]["f"]["agree"]["point"] == 1.0 and out["per_tool"]["g"]["n_tasks"] == 1
    with pytest.raises(ValueError, match="no scored"):
        aggregate([])


def _scored(task: str, tool: str, exact: float, obs: str = "{}") -> dict[str, Any]:
    return {"task_id": task, "sample": 0, "split": "x", "tool": tool, "real_kind": "success",
            "pred_kind": "success", "agree": 1.0, "exact": exact, "field_f1": exact,
            "call": {"name": tool, "arguments": {}}, "observation": obs, "prediction": None}


def test_paired_difference_is_over_the_same_pairs_by_task():
    """A - B per metric, task means first, paired bootstrap over tasks; documents of other pairs are not
    compared (None)."""
    b = [_scored(t, "f" if i % 2 else "g", 0.0) for i, t in enumerate("abcdefgh")]
    a = [{**p, "exact": 1.0, "field_f1": 1.0} if p["task_id"] in "abcdef" else p for p in b]
    out = paired_difference(a, b, resamples=500, seed=1)
    assert out["overall"]["exact"]["point"] == pytest.approx(6 / 8)
    assert 0 < out["overall"]["exact"]["ci_low"] <= 0.75 <= out["overall"]["exact"]["ci_high"] <= 1
    assert out["overall"]["agree"]["point"] == 0.0 and out["overall"]["n_tasks"] == 8
    assert set(out["per_tool"]) == {"f", "g"} and out["per_tool"]["f"]["n_pairs"] == 4
    assert paired_difference(a, b[:-1]) is None  # not the same pairs
    assert paired_difference(a, [{**b[0], "observation": "other"}, *b[1:]]) is None
    assert paired_difference([], []) is None


def _write(path, lines):
    return write_results(path, lines, model="qwen3_8b", benchmark="bfcl_multi_turn", seed=0, scale="smoke",
                         config_hash="0123456789abcdef", git_commit="abc", package_versions={})


def _fidelity_config(tmp_path: Path, repo_root: Path, max_tokens: int, resamples: int = 1000) -> str:
    """The smoke config with report.fidelity.rehearse.max_tokens and report.bootstrap.resamples set."""
    cfg = yaml.safe_load((repo_root / "config/smoke.yaml").read_text())
    cfg["report"]["fidelity"]["rehearse"]["max_tokens"] = max_tokens
    cfg["report"]["bootstrap"]["resamples"] = resamples
    path = tmp_path / f"fidelity_{max_tokens}_{resamples}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_fidelity_command_end_to_end(tmp_path, repo_root):
    model_dir = build_tiny_model(tmp_path / "tiny")
    base = {"benchmark": "bfcl_multi_turn", "split": "base", "seed": 0, "score": 1.0, "subscores": {},
            "status": "ok", "reason": None}
    lines = [
        {**base, "task_id": "t1", "sample": 0, "trajectory": {"messages": CHAT, "tools": [WEATHER_TOOL]}},
        {**base, "task_id": "t2", "sample": 0, "trajectory": {"messages": CHAT[:4], "tools": [WEATHER_TOOL]}},
        {**base, "task_id": "t3", "sample": 0, "score": 0.0, "status": "failed", "reason": "server died"},
    ]
    results = _write(tmp_path / "seed0.jsonl", lines)
    out = tmp_path / "fid" / "tiny.json"
    argv = ["fidelity", "--results", str(results), "--model-path", str(model_dir), "--label", "tiny",
            "--out", str(out), "--config", _fidelity_config(tmp_path, repo_root, 8, 200), "--backend", "hf"]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "bfcl_multi_turn" and doc["trajectory_models"] == ["qwen3_8b"]
    assert doc["summary"]["overall"]["n_pairs"] == 3 == len(doc["pairs"])
    assert doc["summary"]["overall"]["n_tasks"] == 2
    assert doc["skipped"]["failed_without_trajectory"] == 1 and doc["skipped"]["no_observation"] == 2
    assert [p["real_kind"] for p in doc["pairs"]] == ["success", "error", "success"]
    # an untrained model never writes a valid <execution_result> in 8 tokens
    assert doc["summary"]["overall"]["pred_kinds"]["malformed"] == 3
    assert main(argv) == 0 and json.loads(out.read_text())["pairs"] == doc["pairs"]  # deterministic

    other = tmp_path / "fid" / "other.json"
    other.write_text(json.dumps({**doc, "model": "other"}))
    table, csv_path, fig = tmp_path / "t.md", tmp_path / "t.csv", tmp_path / "f.pdf"
    assert main(["fidelity-report", "--inputs", str(out), str(other), "--table", str(table), "--csv",
                 str(csv_path), "--figure", str(fig)]) == 0
    md = table.read_text()
    assert "| bfcl_multi_turn | tiny | (all) | 3 | 2 |" in md
    assert "| bfcl_multi_turn | other | get_weather |" in md
    assert len(csv_path.read_text().splitlines()) == 1 + 2 * 2
    assert " - " not in md  # each model rehearsed qwen3_8b's trajectories, but qwen3_8b did not

    # report.fidelity.trajectories: the trajectories' own model rehearsed the same pairs -> paired rows
    ref = tmp_path / "fid" / "qwen3_8b.json"
    ref.write_text(json.dumps({**doc, "model": "qwen3_8b"}))
    assert main(["fidelity-report", "--inputs", str(out), str(ref), "--table", str(table), "--csv",
                 str(csv_path)]) == 0
    md = table.read_text()
    assert "| bfcl_multi_turn | tiny - qwen3_8b | (all) | 3 | 2 | +0.0 [+0.0, +0.0] |" in md
    assert "paired 95% bootstrap interval" in md
    assert "tiny - other" not in md

    # report.fidelity.contrasts: two models that rehearsed the same trajectories (a run and its control)
    assert main(["fidelity-report", "--inputs", str(out), str(other), "--table", str(table), "--csv",
                 str(csv_path), "--contrast", "tiny:other"]) == 0
    md = table.read_text()
    assert "| bfcl_multi_turn | tiny - other | (all) | 3 | 2 | +0.0 [+0.0, +0.0] |" in md
    assert "other - tiny" not in md and " - qwen3_8b" not in md
    assert main(["fidelity-report", "--inputs", str(out), "--table", str(table), "--csv", str(csv_path),
                 "--contrast", "tiny"]) == 2
    assert fig.stat().st_size > 0 and fig.with_suffix(".png").stat().st_size > 0


def test_fidelity_command_rejects_lines_without_trajectory(tmp_path, capsys):
    line = {"benchmark": "bfcl_multi_turn", "split": "base", "seed": 0, "score": 1.0, "subscores": {},
            "status": "ok", "reason": None, "task_id": "t1", "sample": 0}
    results = _write(tmp_path / "seed0.jsonl", [line])
    code = main(["fidelity", "--results", str(results), "--model-path", str(tmp_path), "--label", "x",
                 "--out", str(tmp_path / "o.json")])
    assert code == 1
    assert "line 1: 'trajectory' must be an object" in capsys.readouterr().err


def test_fidelity_command_takes_tools_from_the_adapter(tmp_path, repo_root, monkeypatch):
    import envace.cli.fidelity as cmd
    from envace.core.environment import Task

    calls: list[tuple[str, Any]] = []

    class FakeAdapter:
        def load_tasks(self, splits, limit):
            calls.append(("load_tasks", (splits, limit)))
            return [Task("t1", "base", None, "q", [WEATHER_TOOL]), Task("t2", "base", None, "q", [])]

    def fake_get_adapter(name, **kwargs):
        calls.append(("get_adapter", name))
        return FakeAdapter()

    monkeypatch.setattr(cmd, "get_adapter", fake_get_adapter)
    model_dir = build_tiny_model(tmp_path / "tiny")
    line = {"benchmark": "bfcl_multi_turn", "split": "base", "seed": 0, "score": 1.0, "subscores": {},
            "status": "ok", "reason": None, "task_id": "t1", "sample": 0,
            "trajectory": {"messages": CHAT[:5], "terminations": ["final_answer"], "act_turns": 1}}
    results = _write(tmp_path / "seed0.jsonl", [line, {**line, "sample": 1}])
    out = tmp_path / "o.json"
    config = _fidelity_config(tmp_path, repo_root, 4)
    assert main(["fidelity", "--results", str(results), "--model-path", str(model_dir), "--label", "tiny",
                 "--out", str(out), "--config", config, "--backend", "hf"]) == 0
    assert [c[0] for c in calls] == ["get_adapter", "load_tasks"]  # loaded once, for all lines
    doc = json.loads(out.read_text())
    assert doc["summary"]["overall"]["n_pairs"] == 4 and doc["summary"]["overall"]["n_tasks"] == 1
    assert doc["bootstrap"]["resamples"] == 1000  # report.bootstrap of the smoke config


def test_fidelity_with_no_pairs_is_a_row_not_an_error(tmp_path):
    """A model whose trajectories hold no tool call (e.g. untrained) gets a 'no pairs' row."""
    base = {"benchmark": "bfcl_multi_turn", "split": "base", "seed": 0, "score": 0.0, "subscores": {},
            "status": "ok", "reason": None}
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    results = _write(tmp_path / "seed0.jsonl", [{**base, "task_id": "t1", "sample": 0,
                                                "trajectory": {"messages": chat, "tools": [WEATHER_TOOL]}}])
    out = tmp_path / "none.json"
    assert main(["fidelity", "--results", str(results), "--model-path", str(tmp_path / "absent"),
                 "--label", "tiny", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["summary"]["overall"] is None and doc["pairs"] == []
    table, csv_path, fig = tmp_path / "t.md", tmp_path / "t.csv", tmp_path / "f.pdf"
    assert main(["fidelity-report", "--inputs", str(out), "--table", str(table), "--csv", str(csv_path),
                 "--figure", str(fig)]) == 0
    assert "| bfcl_multi_turn | tiny | (all) | 0 | 0 | — (no pairs)" in table.read_text()
    assert fig.stat().st_size > 0


def test_reference_agreement_counts_in_reference_order():
    """The k-th answer to a call meets the k-th reference of that call (arguments by value, key order
    ignored); a malformed reply counts as referenced but neither exact nor agreeing; a call the reference
    never made, and an unparsable one, are answered but unreferenced."""
    from envace.core.fidelity import reference_agreement
    from envace.core.rehearsal import parse_rehearsal_output

    def said(text: str):
        return parse_rehearsal_output(f"<execution_result>{text}</execution_result>")

    bal = ToolCall("get_balance", {"account": "A", "currency": "EUR"})
    refs = [
        {"call": {"name": "get_balance", "arguments": {"currency": "EUR", "account": "A"}},
         "response": {"b": 5}},
        {"call": {"name": "transfer", "arguments": "{\"to\": \"B\"}"}, "response": {"error": "UNKNOWN"}},
        {"call": {"name": "get_balance", "arguments": {"account": "A", "currency": "EUR"}},
         "response": {"b": 3}},
        {"not": "a reference"},
    ]
    rehearsed = [
        (bal, said('{"b": 5}')),                                # exact, agree
        (ToolCall("transfer", {"to": "B"}), said('{"ok": true}')),  # success for an error: neither
        (bal, said('{"b": 5.0}')),                              # the second reference (3): agree only
        (bal, parse_rehearsal_output("no tags")),               # a third call: no reference left
        (ToolCall("get_balance", {"account": "Z"}), said('{"b": 1}')),  # never in the reference
        (None, said('{"b": 1}')),                               # unparsable call
    ]
    assert reference_agreement(rehearsed, refs) == {
        "answered": 6, "malformed": 1, "referenced": 3, "exact": 1, "agree": 2}
    assert reference_agreement([(bal, parse_rehearsal_output("no tags"))], refs) == {
        "answered": 1, "malformed": 1, "referenced": 1, "exact": 0, "agree": 0}
    assert reference_agreement([], refs) == dict.fromkeys(("answered", "malformed", "referenced", "exact",
                                                           "agree"), 0)
