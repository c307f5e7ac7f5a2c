"""envace.core.single_call: the authors' caller-only simulator chat and reply, alone and inside a rollout
with a scripted simulator (retries, the {error} observation after the last attempt)."""

from __future__ import annotations

import asyncio
import json

from envace.core.rehearsal import OutcomeKind, ToolRegistry
from envace.core.rollout import Mode, Termination, run_rollout
from envace.core.single_call import (
    RESPONSE_FORMAT,
    failed_outcome,
    parse_single_call_reply,
    single_call_messages,
)
from envace.core.tools import ToolCall, render_tool_call
from tests.fixtures import WEATHER_TOOL_WITH_UNIT as WEATHER_TOOL
from tests.fixtures import eval_rules

TASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}]
CALL = ToolCall("get_weather", {"city": "Oslo"})
REFS = [{"call": {"name": "get_weather", "arguments": {"city": "Rome"}}, "response": '{"temp": 21}'},
        {"call": {"name": "get_time", "arguments": {}}, "response": {"time": "12:00"}}]


def test_the_chat_holds_the_references_the_schema_and_the_arguments_and_nothing_of_the_dialogue() -> None:
    system, user = single_call_messages(CALL, ToolRegistry([WEATHER_TOOL]), REFS)
    assert system["role"] == "system" and '"execution_result"' in system["content"]
    text = user["content"]
    assert text.index('{"city": "Rome"}') < text.index('{"temp": 21}') < text.index('{"time": "12:00"}')
    schema = json.dumps(WEATHER_TOOL["function"]["parameters"], ensure_ascii=True)
    assert schema in text and text.rstrip().endswith('{"city": "Oslo"}')
    assert "Weather in Oslo?" not in text  # no dialogue history: the authors' fallback has none
    _, bare = single_call_messages(ToolCall("unknown_tool", {"x": 1}), ToolRegistry([WEATHER_TOOL]), [])
    assert "none: rely on the input schema" in bare["content"] and "\n{}\n" in bare["content"]


def test_a_reply_is_its_execution_result_and_anything_else_says_why() -> None:
    reply = '<think>x</think> {"analysis": "a", "execution_result": {"t": "é"}}'
    outcome, why = parse_single_call_reply(reply)
    assert why == "" and outcome.kind == OutcomeKind.RESULT and outcome.result == {"t": "é"}
    assert outcome.observation == '{"t": "\\u00e9"}'  # ensure_ascii, as the authors' normalisation
    assert parse_single_call_reply('{"analysis": "a", "execution_result": []}')[0].result == []
    for text, reason in [("not json", "not JSON"), ('{"analysis": "a"}', "no execution_result"),
                         ('{"execution_result": {}}', "non-empty"), ('{"execution_result": 3}', "non-empty"),
                         ("[1]", "no execution_result")]:
        got, why = parse_single_call_reply(text)
        assert got is None and reason in why, (text, why)
    failed = failed_outcome("the simulator's reply is not JSON (invalid)", 5)
    assert failed.kind == OutcomeKind.MALFORMED and not failed.terminate
    why = "the simulator's reply is not JSON (invalid) (after 5 attempts)"
    assert json.loads(failed.observation) == {"error": why}
    schema = RESPONSE_FORMAT["json_schema"]["schema"]
    assert schema["required"] == ["analysis", "execution_result"] and schema["additionalProperties"] is False


def roll(policy, simulator, tokenizer, **rules):
    config = eval_rules(mode=Mode.EXTERNAL_SIMULATOR, simulator_protocol="single_call", **rules)
    return asyncio.run(run_rollout(policy, tokenizer, TASK, [WEATHER_TOOL], config, simulator=simulator,
                                   references=REFS))


def test_the_rollout_asks_again_until_a_reply_parses(tokenizer, scripted) -> None:
    good = '{"analysis": "like Rome", "execution_result": {"temp": 4}}'
    policy, simulator = scripted([render_tool_call(CALL), "It is 4."]), scripted(["{broken", "[]", good])
    traj = roll(policy, simulator, tokenizer)
    assert traj.termination == Termination.FINAL_ANSWER
    assert [json.loads(m["content"]) for m in traj.messages if m["role"] == "tool"] == [{"temp": 4}]
    rehearse = [g for g in traj.generations if g.role == "rehearse"]
    assert len(rehearse) == 3 and not any(g.trainable for g in rehearse)
    assert all(p["response_format"] == RESPONSE_FORMAT for p in simulator.params)
    prompt = tokenizer.decode(simulator.prompt_ids[0])
    assert prompt.count("<|im_start|>") == 3 and "Weather in Oslo?" not in prompt  # system, user, assistant
    assert simulator.prompt_ids[0] == simulator.prompt_ids[2]  # the same fresh chat each time
    assert traj.rehearsed == [(CALL, traj.rehearsed[0][1])] and traj.rehearsed[0][1].result == {"temp": 4}


def test_after_the_last_attempt_the_observation_is_an_error_and_the_episode_goes_on(tokenizer,
                                                                                    scripted) -> None:
    policy, simulator = scripted([render_tool_call(CALL), "Sorry."]), scripted(["nope", "nope"])
    traj = roll(policy, simulator, tokenizer, simulator_attempts=2)
    assert traj.termination == Termination.FINAL_ANSWER and traj.final_answer == "Sorry."
    observation = json.loads([m for m in traj.messages if m["role"] == "tool"][0]["content"])
    assert observation == {"error": "the simulator's reply is not JSON (invalid) (after 2 attempts)"}
    assert len(simulator.prompt_ids) == 2 and traj.rehearsed[0][1].kind == OutcomeKind.MALFORMED
