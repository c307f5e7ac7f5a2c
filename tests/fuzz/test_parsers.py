"""Property tests of the parsers of model output: total (never raise), strict about what they let
through (valid Unicode, finite numbers, bounded nesting), and equal to the regex semantics they replace."""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace.core import tools
from envace.core.rehearsal import (
    MALFORMED_CODE,
    CallCandidate,
    OutcomeKind,
    RehearsalError,
    ToolRegistry,
    parse_rehearsal_output,
    precheck_call,
)
from envace.core.tools import (
    MAX_JSON_DEPTH,
    JSONProblem,
    ParseError,
    ToolCall,
    load_model_json,
    parse_tool_calls,
)
from envace.core.tts import parse_evaluation, parse_memory

from .strategies import (
    TAGS,
    any_char,
    any_text,
    depth_of,
    has_non_finite,
    has_surrogate,
    hostile_values,
    json_values,
    nested,
    tool_call_text,
)

FAST = settings(max_examples=400, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
CODES = {e.value for e in RehearsalError}

# texts built from protocol tags, JSON punctuation and any character: where parsers go wrong
PIECES = ["{", "}", "[", "]", '"', ":", ",", "\\", "\\ud800", "NaN", "1e999",
          '"name"', '"arguments"', '"error"']
fragment = st.one_of(st.sampled_from(TAGS + PIECES), any_char)
tag_soup = st.lists(fragment, max_size=40).map("".join)
model_text = st.one_of(any_text(60), tag_soup)


def _encodable(value: object) -> None:
    """What a parser passes on must survive strict JSON and UTF-8."""
    json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")


@FAST
@given(model_text)
def test_parse_tool_calls_is_total_and_lets_only_clean_json_through(text: str) -> None:
    out = parse_tool_calls(text)
    if out.error is not None:
        assert out.error in set(ParseError) and out.calls == [] and out.final_answer is None
        return
    assert out.calls or out.final_answer is not None
    for call in out.calls:
        assert call.name and isinstance(call.arguments, dict)
        _encodable({"name": call.name, "arguments": call.arguments})
        assert depth_of(call.arguments) < MAX_JSON_DEPTH


@FAST
@given(tool_call_text(), st.text(alphabet=st.characters(exclude_characters="<"), max_size=10))
def test_a_well_formed_block_parses_unless_its_json_cannot_be_carried(
    block: tuple[str, str, dict], preamble: str
) -> None:
    text, name, args = block
    out = parse_tool_calls(preamble + text)
    if has_non_finite(args):
        assert out.error == ParseError.INVALID_JSON  # NaN / Infinity literals are not JSON
    elif has_surrogate(args) or has_surrogate(name):
        assert out.error == ParseError.INVALID_UNICODE
    else:
        assert out.error is None and out.calls == [ToolCall(name, args)]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(1, 3000), st.booleans())
def test_deep_arguments_are_json_too_deep_at_any_depth(depth: int, as_string: bool) -> None:
    obj = '{"b": ' + "[" * depth + "0" + "]" * depth + "}"
    inner = json.dumps(obj) if as_string else obj  # arguments as an object, or as a JSON string holding it
    out = parse_tool_calls(f'<tool_call>{{"name": "f", "arguments": {inner}}}</tool_call>')
    if depth + 2 <= MAX_JSON_DEPTH:
        assert out.error is None and depth_of(out.calls[0].arguments) == depth + 1
    else:
        assert out.error == ParseError.JSON_TOO_DEEP


@FAST
@given(json_values)
def test_load_model_json_agrees_with_json_on_clean_values(value: object) -> None:
    text = json.dumps(value)
    meant = json.loads(text)  # an escaped surrogate pair decodes to one character, a lone one stays
    got, problem = load_model_json(text)
    if has_non_finite(meant):
        assert problem == JSONProblem.INVALID
    elif has_surrogate(meant):
        assert problem == JSONProblem.LONE_SURROGATE
    elif depth_of(meant) > MAX_JSON_DEPTH:
        assert problem == JSONProblem.TOO_DEEP
    else:
        assert problem is None and got == meant


def _regex_strip_think(text: str) -> str | None:
    """The reasoning removal as it was written with a lazy regex (the reference semantics)."""
    first_close, first_open = text.find("</think>"), text.find("<think>")
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        text = text[first_close + len("</think>"):]
    text = re.sub("<think>.*?</think>", "", text, flags=re.DOTALL)
    return None if "<think>" in text or "</think>" in text else text


think_soup = st.lists(st.sampled_from(["<think>", "</think>", "<thi", "nk>", "</", "a", "<", ">"]),
                      max_size=30).map("".join)


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(think_soup)
def test_linear_think_stripping_equals_the_regex(text: str) -> None:
    assert tools.strip_think(text) == _regex_strip_think(text)


block_soup = st.lists(st.sampled_from(["<a>", "</a>", "<a", "/a>", "x", "<", ">"]), max_size=30).map("".join)


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(block_soup)
def test_find_block_equals_the_lazy_regex(text: str) -> None:
    match = re.search("<a>(.*?)</a>", text, re.DOTALL)
    assert tools.find_block(text, "<a>", "</a>") == (match.group(1) if match else None)


@FAST
@given(model_text)
def test_parse_rehearsal_output_is_total(text: str) -> None:
    out = parse_rehearsal_output(text)
    observation = json.loads(out.observation)
    out.observation.encode("utf-8")
    if out.kind == OutcomeKind.MALFORMED:
        assert observation["error"] == MALFORMED_CODE and out.terminate
    elif out.kind == OutcomeKind.ERROR:
        assert out.error in set(RehearsalError) and observation["error"] == out.error.value
    else:
        _encodable(out.result)


@FAST
@given(st.one_of(st.sampled_from(sorted(CODES)), json_values), json_values,
       st.sampled_from(["", "<think>x</think>", "</think>"]))
def test_any_error_field_is_an_error_code_or_a_result(error: object, message: object, think: str) -> None:
    body = json.dumps({"error": error, "message": message}, ensure_ascii=True)
    meant = json.loads(body)
    error, message = meant["error"], meant["message"]
    out = parse_rehearsal_output(f"{think}<execution_result>{body}</execution_result>")
    if has_non_finite(meant) or has_surrogate(meant):
        assert out.kind == OutcomeKind.MALFORMED
    elif isinstance(error, str) and error in CODES:
        assert out.kind == OutcomeKind.ERROR and out.error == RehearsalError(error)
        assert json.loads(out.observation)["message"] == (message if isinstance(message, str) else "")
    else:
        assert out.kind == OutcomeKind.RESULT and out.result == {"error": error, "message": message}


NODE = {"type": "object", "properties": {
    "child": {"$ref": "#/$defs/node"},
    "items": {"type": "array", "items": {"$ref": "#/$defs/node"}},
    "label": {"type": "string", "pattern": "^[a-z]*$"},
}}
RECURSIVE_TOOL = {"name": "tree", "parameters": {
    "type": "object", "properties": {"node": {"$ref": "#/$defs/node"}}, "$defs": {"node": NODE}}}
BAD_PATTERN_TOOL = {"name": "bad", "parameters": {"type": "object", "properties": {"q": {"type": "string",
                                                                                         "pattern": "("}}}}
LOOSE_TOOL = {"name": "loose", "parameters": {"type": "object"}}
REGISTRY = ToolRegistry([RECURSIVE_TOOL, BAD_PATTERN_TOOL, LOOSE_TOOL])


def _tree(depth: int) -> dict:
    node: dict = {"label": "leaf"}
    for _ in range(depth):
        node = {"child": node, "items": [{"label": "x"}]}
    return {"node": node}


arguments = st.one_of(
    st.dictionaries(any_text(6), hostile_values, max_size=3),
    st.integers(0, 2500).map(_tree),
    st.integers(0, 2500).map(lambda d: {"node": nested(d, {})}),
    st.builds(lambda q: {"q": q}, any_text(6)),
)


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["tree", "bad", "loose", "missing"]), arguments, st.sampled_from(["format", "schema"]))
def test_precheck_never_raises(name: str, args: dict, level: str) -> None:
    out = precheck_call(CallCandidate(ToolCall(name, args), "raw"), REGISTRY, level)  # type: ignore[arg-type]
    if out is not None:
        assert out.kind == OutcomeKind.ERROR and out.prechecked
        assert json.loads(out.observation)["error"] in CODES
    if name == "missing" and level == "schema":
        assert out is not None and out.error == RehearsalError.TOOL_NOT_AVAILABLE


@FAST
@given(model_text)
def test_tts_parsers_are_total(text: str) -> None:
    evaluation = parse_evaluation(text)
    assert evaluation.fallback or isinstance(evaluation.success, bool)
    if not evaluation.fallback:
        evaluation.feedback.encode("utf-8")
    memory = parse_memory(text)
    assert memory is None or (memory and memory == memory.strip())


verdict_text = st.one_of(
    model_text,
    st.builds(lambda think, value, tail: think + json.dumps({"passed": value, "reason": "r"}) + tail,
              st.sampled_from(["", "<think>x</think>", " <think>\n</think>\n", "<think>"]),
              st.one_of(st.booleans(), json_values), st.sampled_from(["", " ", "x", "}"])),
)


@FAST
@given(verdict_text)
def test_parse_verdict_is_total_and_strict(text: str) -> None:
    """The checklist judge's verdict parser: True/False only for a JSON object whose "passed" is a bool
    (after one leading think block), None for anything else; never raises."""
    from envace.train.judge import parse_verdict

    out = parse_verdict(text)
    assert out in (True, False, None)
    if out is not None:
        body = re.sub(r"^\s*<think>.*?</think>", "", text, count=1, flags=re.DOTALL).strip()
        assert json.loads(body)["passed"] is out


def test_parse_verdict_time_is_bounded() -> None:
    import time

    from envace.train.judge import parse_verdict

    for text in ("<think>" * 100_000, "{" * 100_000, "<think>" + "x" * 100_000, '{"passed": ' * 20_000):
        t0 = time.perf_counter()
        assert parse_verdict(text) is None
        assert time.perf_counter() - t0 < 1.0
