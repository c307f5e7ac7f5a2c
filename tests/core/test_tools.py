"""Tests for envace.core.tools: the hermes tool-call parser and renderer."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace.core.tools import ParsedOutput, ParseError, ToolCall, parse_tool_calls, render_tool_call

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    json_scalars | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
arguments_st = st.dictionaries(st.text(), json_values, max_size=5)
call_st = st.builds(ToolCall, name=st.text(min_size=1), arguments=arguments_st)


def test_render_matches_qwen3_format() -> None:
    block = render_tool_call(ToolCall("get_weather", {"city": "Paris", "days": 2}))
    expected = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
    assert block == f"<tool_call>\n{expected}\n</tool_call>"


def test_parallel_calls_think_and_preamble() -> None:
    text = (
        "<think>I need two lookups.</think>\nLet me check.\n"
        + render_tool_call(ToolCall("a", {"x": 1}))
        + "\n"
        + render_tool_call(ToolCall("b", {}))
    )
    out = parse_tool_calls(text)
    assert out.error is None
    assert out.calls == [ToolCall("a", {"x": 1}), ToolCall("b", {})]
    assert out.final_answer == "Let me check."


def test_final_answer_only_and_leading_think_close() -> None:
    assert parse_tool_calls("  The answer is 4.  ") == ParsedOutput(final_answer="The answer is 4.")
    assert parse_tool_calls("reasoning...</think>\n\nDone").final_answer == "Done"


def test_arguments_as_json_string_and_missing() -> None:
    out = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"k\\": [1]}"}</tool_call>')
    assert out.calls == [ToolCall("f", {"k": [1]})]
    assert parse_tool_calls('<tool_call>{"name": "f"}</tool_call>').calls == [ToolCall("f", {})]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("<think>unfinished", ParseError.BAD_THINK_BLOCK),
        ("a</think>b</think>", ParseError.BAD_THINK_BLOCK),
        ('<tool_call>{"name": "f"}', ParseError.UNCLOSED_BLOCK),
        ("<tool_call><tool_call>{}</tool_call>", ParseError.NESTED_BLOCK),
        ("x</tool_call>", ParseError.STRAY_CLOSE_TAG),
        ("<tool_call></tool_call>", ParseError.INVALID_JSON),
        ("<tool_call>{name: f}</tool_call>", ParseError.INVALID_JSON),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", ParseError.JSON_TOO_DEEP),
        ('<tool_call>{"name": "f", "arguments": {"a": NaN}}</tool_call>', ParseError.INVALID_JSON),
        ('<tool_call>{"name": "f", "arguments": {"a": "\\udc00"}}</tool_call>', ParseError.INVALID_UNICODE),
        ('<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 64 + "]" * 64 + "}}</tool_call>",
         ParseError.JSON_TOO_DEEP),
        ('<tool_call>["f"]</tool_call>', ParseError.CALL_NOT_OBJECT),
        ('<tool_call>{"arguments": {}}</tool_call>', ParseError.MISSING_NAME),
        ('<tool_call>{"name": 3}</tool_call>', ParseError.NAME_NOT_STRING),
        ('<tool_call>{"name": ""}</tool_call>', ParseError.EMPTY_NAME),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', ParseError.ARGUMENTS_NOT_OBJECT),
        ('<tool_call>{"name": "f", "arguments": "[1]"}</tool_call>', ParseError.ARGUMENTS_NOT_OBJECT),
        ('<tool_call>{"name": "f", "arguments": "{bad"}</tool_call>', ParseError.ARGUMENTS_NOT_OBJECT),
        ('<tool_call>{"name": "f", "params": {}}</tool_call>', ParseError.UNEXPECTED_KEY),
        ("   ", ParseError.EMPTY_OUTPUT),
        ("<think>only thinking</think>", ParseError.EMPTY_OUTPUT),
    ],
)
def test_error_codes(text: str, code: ParseError) -> None:
    out = parse_tool_calls(text)
    assert out == ParsedOutput(error=code)


def test_parameters_key_is_accepted_by_default() -> None:
    """Authors' tool_parser.py: "parameters" is the arguments key (before "arguments"); off: an error."""
    out = parse_tool_calls('<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>')
    assert out.error is None and out.calls == [ToolCall("f", {"a": 1})]
    both = parse_tool_calls('<tool_call>{"name": "f", "parameters": {"a": 1}, "arguments": {"b": 2}}'
                            "</tool_call>")
    assert both.calls == [ToolCall("f", {"a": 1})]
    as_string = parse_tool_calls('<tool_call>{"name": "f", "parameters": "{\\"a\\": 1}"}</tool_call>')
    assert as_string.calls == [ToolCall("f", {"a": 1})]
    null = parse_tool_calls('<tool_call>{"name": "f", "parameters": null, "arguments": {"b": 2}}</tool_call>')
    assert null.calls == [ToolCall("f", {"b": 2})]
    old = parse_tool_calls('<tool_call>{"name": "f", "parameters": {}}</tool_call>', parameters_key=False)
    assert old == ParsedOutput(error=ParseError.UNEXPECTED_KEY)


def test_first_error_wins_no_partial_parse() -> None:
    good = render_tool_call(ToolCall("f", {}))
    out = parse_tool_calls(good + '<tool_call>{"name": 1}</tool_call>')
    assert out.calls == [] and out.final_answer is None and out.error is ParseError.NAME_NOT_STRING


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(call_st, min_size=1, max_size=3), st.text(alphabet=st.characters(exclude_characters="<")))
def test_round_trip(calls: list[ToolCall], preamble: str) -> None:
    text = preamble + "\n".join(render_tool_call(c) for c in calls)
    out = parse_tool_calls(text)
    assert out.error is None
    assert out.calls == calls
    assert out.final_answer == (preamble.strip() or None)


small_call_st = st.builds(ToolCall, name=st.text(min_size=1, max_size=8),
                          arguments=st.dictionaries(st.text(max_size=5), json_scalars | st.text(max_size=8),
                                                    max_size=3))
FRAGMENTS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", '"', ":", ",", "[", "]",
             '"name"', '"arguments"', "\\", "\n", "null", "1", "<", ">", "/"]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A rendered call (or plain text) with random insertions, deletions and substitutions."""
    base = draw(st.one_of(st.text(max_size=60), st.lists(small_call_st, max_size=2).map(
        lambda cs: "".join(render_tool_call(c) for c in cs))))
    chars = list(base)
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        pos = draw(st.integers(0, len(chars)))
        if op == "insert":
            chars.insert(pos, draw(st.sampled_from(FRAGMENTS) | st.characters()))
        elif chars and pos < len(chars):
            if op == "delete":
                del chars[pos]
            else:
                chars[pos] = draw(st.sampled_from(FRAGMENTS))
    return "".join(chars)


@settings(max_examples=10_000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.one_of(st.text(), mutated()))
def test_fuzz_never_raises_and_code_documented(text: str) -> None:
    out = parse_tool_calls(text)
    if out.error is not None:
        assert out.error in set(ParseError)
        assert out.calls == [] and out.final_answer is None
    else:
        assert out.calls or out.final_answer is not None
        for call in out.calls:
            assert isinstance(call.name, str) and call.name and isinstance(call.arguments, dict)
            json.dumps(call.arguments)
