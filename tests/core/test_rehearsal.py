"""Tests for envace.core.rehearsal: validation order, prechecks, output parsing, prompt, prefix stability."""

from __future__ import annotations

import json

import pytest

from envace.core.prompts import load_prompt
from envace.core.rehearsal import (
    MALFORMED_CODE,
    CallCandidate,
    OutcomeKind,
    RehearsalContext,
    RehearsalError,
    RehearsalPrompt,
    ToolRegistry,
    parse_rehearsal_output,
    precheck_call,
)
from envace.core.tools import ParseError, ToolCall
from tests.fixtures import WEATHER_TOOL_WITH_UNIT as WEATHER_TOOL  # the validation tests use its unit enum


def cand(name: str | None, args: dict | None = None) -> CallCandidate:
    if name is None:
        return CallCandidate(None, "<tool_call>oops", ParseError.UNCLOSED_BLOCK)
    return CallCandidate(ToolCall(name, args or {}), "raw")


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        (cand(None), RehearsalError.INVALID_TOOL_CALL_FORMAT),
        (cand("nope", {"bad": 1}), RehearsalError.TOOL_NOT_AVAILABLE),  # name checked before arguments
        (cand("get_weather", {}), RehearsalError.INVALID_PARAMETERS),
        (cand("get_weather", {"city": 3}), RehearsalError.INVALID_PARAMETERS),
        (cand("get_weather", {"city": "Oslo", "extra": 1}), RehearsalError.INVALID_PARAMETERS),
        (cand("get_weather", {"city": "Oslo", "unit": "k"}), RehearsalError.INVALID_PARAMETERS),
        (cand("get_weather", {"city": "Oslo", "unit": "c"}), None),
    ],
)
def test_validation_order(candidate: CallCandidate, expected: RehearsalError | None) -> None:
    result = ToolRegistry([WEATHER_TOOL]).validate(candidate)
    assert (result[0] if result else None) == expected


def test_precheck_levels() -> None:
    reg = ToolRegistry([WEATHER_TOOL])
    assert precheck_call(cand(None), reg, "none") is None
    out = precheck_call(cand(None), reg, "format")
    assert out is not None and out.error == RehearsalError.INVALID_TOOL_CALL_FORMAT and out.prechecked
    assert precheck_call(cand("nope"), reg, "format") is None
    out = precheck_call(cand("get_weather", {}), reg, "schema")
    assert out is not None and out.kind == OutcomeKind.ERROR
    assert json.loads(out.observation)["error"] == "INVALID_PARAMETERS"
    assert precheck_call(cand("get_weather", {"city": "x"}), reg, "schema") is None
    with pytest.raises(ValueError, match="precheck"):
        precheck_call(cand(None), reg, "all")  # type: ignore[arg-type]


def test_registry_bare_specs_and_broken_schema() -> None:
    reg = ToolRegistry([{"name": "f", "parameters": {"type": "nonsense"}}, {"name": "g"}])
    assert reg.names == ["f", "g"]
    assert reg.tools[0]["type"] == "function"
    assert reg.validate(cand("f", {"anything": 1})) is None  # broken schema: not prechecked
    assert reg.validate(cand("g", {"x": 1})) is None
    with pytest.raises(ValueError, match="function name"):
        ToolRegistry([{"type": "function"}])


def test_parse_rehearsal_output() -> None:
    ok = parse_rehearsal_output('<think>hm</think><execution_result> {"temp": 3} </execution_result>')
    assert ok.kind == OutcomeKind.RESULT and ok.result == {"temp": 3} and not ok.terminate
    assert ok.observation == '{"temp": 3}'
    err = parse_rehearsal_output('<execution_result>{"error": "TOOL_NOT_AVAILABLE"}</execution_result>')
    assert err.kind == OutcomeKind.ERROR and err.error == RehearsalError.TOOL_NOT_AVAILABLE
    assert json.loads(err.observation) == {"error": "TOOL_NOT_AVAILABLE", "message": ""}
    assert parse_rehearsal_output(
        '<execution_result>{"error": "INVALID_PARAMETERS", "message": "m"}</execution_result>',
        terminate_on_error=True).terminate
    other = parse_rehearsal_output('<execution_result>{"error": "not found"}</execution_result>')
    assert other.kind == OutcomeKind.RESULT  # a tool's own error payload is a result
    for bad in ["no block", "<execution_result>{bad</execution_result>", "<execution_result>1"]:
        mal = parse_rehearsal_output(bad)
        assert mal.kind == OutcomeKind.MALFORMED and mal.terminate
        assert json.loads(mal.observation)["error"] == MALFORMED_CODE
    assert not parse_rehearsal_output("x", terminate_on_malformed=False).terminate


def test_prompt_file_versioned() -> None:
    data = load_prompt("rehearsal_v1", required=RehearsalPrompt.FIELDS)
    assert data["version"] == "rehearsal_v1"
    prompt = RehearsalPrompt()
    system = prompt.system()
    for code in RehearsalError:
        assert code.value in system
    assert "<execution_result>" in system
    with pytest.raises(FileNotFoundError):
        load_prompt("rehearsal_v0")
    with pytest.raises(ValueError, match="lacks"):
        load_prompt("rehearsal_v1", required=("missing_field",))


def test_first_user_contains_sections() -> None:
    prompt = RehearsalPrompt()
    refs = [{"call": {"name": "get_weather", "arguments": {"city": "Rome"}}, "response": {"t": 30}}]
    history = [{"role": "user", "content": "weather in Oslo?"}]
    text = prompt.first_user(ToolRegistry([WEATHER_TOOL]).tools, refs, history, [],
                             cand("get_weather", {"city": "Oslo"}))
    assert text.index("get_weather") < text.index('"Rome"') < text.index("weather in Oslo?")
    assert text.rstrip().endswith('{"name": "get_weather", "arguments": {"city": "Oslo"}}')
    assert "Reference" not in prompt.first_user([], [], history, [], cand(None))


def test_context_prefix_stable_at_token_level(tokenizer) -> None:
    ctx = RehearsalContext(tokenizer, RehearsalPrompt(), ToolRegistry([WEATHER_TOOL]),
                           [{"role": "user", "content": "hi"}])
    assert ctx.encoded_tokens == 0
    p1 = list(ctx.prompt_ids(cand("get_weather", {"city": "A"})))
    reply = tokenizer.encode('<execution_result>{"t": 1}</execution_result>', add_special_tokens=False)
    ctx.record_response(reply + [tokenizer.eos_token_id])
    ctx.note(cand("nope"), '{"error": "TOOL_NOT_AVAILABLE", "message": ""}')
    p2 = list(ctx.prompt_ids(cand("get_weather", {"city": "B"})))
    assert p2[: len(p1)] == p1
    assert p2[len(p1): len(p1) + len(reply) + 1] == reply + [tokenizer.eos_token_id]
    tail = tokenizer.decode(p2[len(p1) + len(reply) + 1:])
    assert "nope" in tail and '"B"' in tail and '"A"' not in tail
    # Only the first prompt and the new delta were encoded (model tokens never).
    assert ctx.encoded_tokens == len(p2) - len(reply) - 1
    ctx.record_response(reply)  # truncated reply: no turn end
    p3 = list(ctx.prompt_ids(cand("get_weather", {"city": "C"})))
    assert p3[: len(p2) + len(reply)] == p2 + reply
    assert p3[len(p2) + len(reply)] == tokenizer.eos_token_id


@pytest.mark.parametrize("switch", [False, True])
def test_think_switch_ends_every_user_message(tokenizer, switch: bool) -> None:
    """``think_switch`` (the authors' ``SIM_APPEND_THINK_SWITCH``): each REHEARSE user message, the first
    and the later ones, ends in a blank line and ``/think``; without it no message has it."""
    ctx = RehearsalContext(tokenizer, RehearsalPrompt(), ToolRegistry([WEATHER_TOOL]),
                           [{"role": "user", "content": "hi"}], think_switch=switch)
    first = tokenizer.decode(ctx.prompt_ids(cand("get_weather", {"city": "A"})))
    ctx.record_response(tokenizer.encode("<execution_result>1</execution_result>", add_special_tokens=False))
    both = tokenizer.decode(ctx.prompt_ids(cand("get_weather", {"city": "B"})))
    later = both[len(first):]
    assert first.count("/think") == later.count("/think") == (1 if switch else 0)
    if switch:
        assert '"A"' in first.split("/think")[0] and '"B"' in later.split("/think")[0]
        assert "\n\n/think" in first


def test_record_before_prompt_raises(tokenizer) -> None:
    ctx = RehearsalContext(tokenizer, RehearsalPrompt(), ToolRegistry([WEATHER_TOOL]), [])
    with pytest.raises(RuntimeError):
        ctx.record_response([1])


def test_v2_renders_as_v1_without_dialogue_and_lists_events_in_order() -> None:
    """v2 = v1 + the dialogue section: byte-identical prompts when no ACT-chat message arrived after the
    first rehearsal (single-turn episodes, evaluation, TTS, fidelity); else notes and dialogue messages
    in the order they happened. v1 drops the messages (ours before)."""
    v1, v2 = RehearsalPrompt("rehearsal_v1"), RehearsalPrompt("rehearsal_v2")
    assert (v1.version, v2.version, v1.sees_dialogue, v2.sees_dialogue) == ("rehearsal_v1", "rehearsal_v2",
                                                                           False, True)
    assert RehearsalPrompt().version == "rehearsal_v2"
    tools = ToolRegistry([WEATHER_TOOL]).tools
    history = [{"role": "user", "content": "weather in Oslo?"}]
    note = (cand("nope"), '{"error": "TOOL_NOT_AVAILABLE", "message": ""}')
    call = cand("get_weather", {"city": "Oslo"})
    for notes in ([], [note]):
        same = [p.first_user(tools, [], history, notes, call) for p in (v1, v2)]
        assert same[0] == same[1]
        assert v2.next_user(notes, call) == v1.next_user(notes, call)
        assert v2.system() == v1.system()
    answer = {"role": "assistant", "content": "It is 4 degrees."}
    user = {"role": "user", "content": "And in Bergen?"}
    events = [note, answer, user, note]
    text = v2.next_user(events, call)
    marks = [text.index("Calls answered without you"), text.index("It is 4 degrees."),
             text.index("And in Bergen?"), text.rindex("Calls answered without you"),
             text.index("# Caller output")]
    assert marks == sorted(marks) and len(set(marks)) == 5
    assert text.count("# The conversation since your last reply") == 1
    assert "[user]\nAnd in Bergen?" in text
    assert v1.next_user(events, call) == v1.next_user([note, note], call)  # messages dropped
    assert "Bergen" not in v1.next_user(events, call)


def test_observe_messages_before_and_after_the_first_rehearsal(tokenizer) -> None:
    answer = {"role": "assistant", "content": "It is 4 degrees."}
    user = {"role": "user", "content": "And in Bergen-XYZ?"}
    start = [{"role": "user", "content": "hi"}]
    reply = tokenizer.encode('<execution_result>{"t": 1}</execution_result>', add_special_tokens=False)
    for name in ("rehearsal_v1", "rehearsal_v2"):
        # before any rehearsal: the dialogue becomes the first message's history (both versions)
        ctx = RehearsalContext(tokenizer, RehearsalPrompt(name), ToolRegistry([WEATHER_TOOL]), list(start))
        ctx.observe_messages([answer, user], start + [answer, user])
        assert "Bergen-XYZ" in tokenizer.decode(ctx.prompt_ids(cand("get_weather", {"city": "B"})))
        # after one: only v2 shows it, in the next user message (the chat stays prefix-stable)
        ctx = RehearsalContext(tokenizer, RehearsalPrompt(name), ToolRegistry([WEATHER_TOOL]), list(start))
        p1 = list(ctx.prompt_ids(cand("get_weather", {"city": "A"})))
        ctx.record_response(reply + [tokenizer.eos_token_id])
        ctx.observe_messages([answer, user], start + [answer, user])
        p2 = list(ctx.prompt_ids(cand("get_weather", {"city": "B"})))
        assert p2[: len(p1)] == p1
        tail = tokenizer.decode(p2[len(p1):])
        assert ("Bergen-XYZ" in tail and "It is 4 degrees." in tail) == (name == "rehearsal_v2")
