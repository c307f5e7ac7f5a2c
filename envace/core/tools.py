"""Tool-call protocol: the Qwen3 / hermes ``<tool_call>`` format.

A model output ("ACT turn") contains zero or more blocks

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Several blocks in one output are parallel calls, kept in order. Text outside the blocks (after removing
``<think>...</think>`` reasoning) is the final answer, or a preamble when there are calls.

Implemented here:
- :func:`parse_tool_calls` — a total parser (never raises) returning :class:`ParsedOutput` with either
  the calls / final answer or exactly one :class:`ParseError` code (the first problem found, scanning
  left to right). On error ``calls`` is empty and ``final_answer`` is ``None``: no partial parses.
- :func:`load_model_json` — strict decoding of JSON a model wrote (used by every parser of model output
  here and in :mod:`envace.core.rehearsal` / :mod:`envace.core.tts`): RFC 8259 JSON only, every string valid
  Unicode, nesting at most :data:`MAX_JSON_DEPTH`; a problem is returned, never raised.
- :func:`find_block` — the body of the first ``OPEN...CLOSE`` block of a text, found with ``str.find``.
- :func:`render_tool_call` — the exact block Qwen3's chat template writes for an assistant tool call
  (``json.dumps`` with default separators and ``ensure_ascii=False``).
- :func:`assistant_message` / :func:`tool_message` — OpenAI-style chat messages for the template.
- :func:`render_chat` — messages + tools through a tokenizer's own chat template.
- :class:`ChatTokens` — a chat context kept as token ids that only grow (model tokens as generated,
  other messages as chat-template deltas), so nothing the model generated is ever re-encoded.

Conventions (ours, where the format leaves a choice):
- ``arguments`` may be an object or a JSON string holding an object (OpenAI style); the string is
  decoded. A missing ``arguments`` key means ``{}``. ``parameters`` is accepted as the arguments key
  and wins over ``arguments`` when both are present and not null (the authors' code,
  ``agent_system/environments/env_package/checklist/tool_parser.py`` ``parse_tool_calls``; switch
  ``parameters_key``, config ``training.reward_rules.parameters_key``). Any other key is an error
  (``UNEXPECTED_KEY``), and so is ``parameters`` with ``parameters_key=False`` (ours).
- Reasoning: complete ``<think>...</think>`` blocks are removed; a leading ``...</think>`` without an
  opening tag is accepted (the generation prompt may have opened the block); any other ``<think>`` or
  ``</think>`` is ``BAD_THINK_BLOCK``.
- An output with no calls and no text is ``EMPTY_OUTPUT``.
- JSON (ours, I-JSON style, RFC 7493): ``NaN`` / ``Infinity`` literals are ``INVALID_JSON``; a string
  holding a lone surrogate escape such as ``"\\ud800"`` (valid JSON syntax, but no UTF-8 encoding exists,
  so no tokenizer, server or result file could carry it) is ``INVALID_UNICODE``; a body nested deeper
  than :data:`MAX_JSON_DEPTH` arrays/objects is ``JSON_TOO_DEEP`` (schema validation, chat templates and
  result writing all recurse per level).
- Time is linear in the length of ``text`` (no backtracking regular expressions): a model stuck
  repeating a tag costs one pass over its output.
- :func:`render_tool_call` writes ``<`` as ``\\u003c`` only where the JSON text would otherwise contain
  one of the protocol tags, so every call round-trips through the parser while ordinary calls stay
  byte-identical to Qwen3's template.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

__all__ = [
    "TOOL_CALL_OPEN",
    "TOOL_CALL_CLOSE",
    "strip_think",
    "reasoning_text",
    "transcript",
    "MAX_JSON_DEPTH",
    "JSONProblem",
    "load_model_json",
    "find_block",
    "ParseError",
    "ToolCall",
    "ParsedOutput",
    "ChatTemplateTokenizer",
    "parse_tool_calls",
    "render_tool_call",
    "assistant_message",
    "tool_message",
    "render_chat",
    "ChatTokens",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

#: Deepest nesting of arrays/objects accepted in model-written JSON (ours; a tool call's arguments sit at
#: depth 2, real schemas need a handful of levels).
MAX_JSON_DEPTH = 64

_TAG_RE = re.compile(f"({re.escape(TOOL_CALL_OPEN)}|{re.escape(TOOL_CALL_CLOSE)})")
_PROTOCOL_TAG_RE = re.compile("<(?=/?(?:tool_call|think)>)")


class ParseError(StrEnum):
    """Every error code :func:`parse_tool_calls` can return (documented set)."""

    BAD_THINK_BLOCK = "BAD_THINK_BLOCK"  # unmatched <think> / </think> (other than a leading </think>)
    UNCLOSED_BLOCK = "UNCLOSED_BLOCK"  # <tool_call> without a closing </tool_call>
    NESTED_BLOCK = "NESTED_BLOCK"  # <tool_call> inside an open block
    STRAY_CLOSE_TAG = "STRAY_CLOSE_TAG"  # </tool_call> without an opening tag
    INVALID_JSON = "INVALID_JSON"  # block body is not JSON (includes an empty body)
    CALL_NOT_OBJECT = "CALL_NOT_OBJECT"  # block body is JSON but not an object
    MISSING_NAME = "MISSING_NAME"  # no "name" key
    NAME_NOT_STRING = "NAME_NOT_STRING"  # "name" is not a string
    EMPTY_NAME = "EMPTY_NAME"  # "name" is the empty string
    ARGUMENTS_NOT_OBJECT = "ARGUMENTS_NOT_OBJECT"  # not an object, nor a JSON string holding one
    UNEXPECTED_KEY = "UNEXPECTED_KEY"  # a key other than "name" / "arguments" (/ "parameters")
    EMPTY_OUTPUT = "EMPTY_OUTPUT"  # no call and no text
    INVALID_UNICODE = "INVALID_UNICODE"  # a JSON string holds a lone surrogate (the escape \ud800)
    JSON_TOO_DEEP = "JSON_TOO_DEEP"  # arrays/objects nested deeper than MAX_JSON_DEPTH


class JSONProblem(StrEnum):
    """Why :func:`load_model_json` refused a text."""

    INVALID = "invalid"  # not JSON (RFC 8259), including NaN / Infinity literals and an empty text
    LONE_SURROGATE = "lone_surrogate"  # a string (value or key) holds a lone surrogate code point
    TOO_DEEP = "too_deep"  # nesting deeper than the limit


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_decoded(value: Any, max_depth: int) -> JSONProblem | None:
    """Depth and string check of a decoded JSON value, iteratively (no recursion on model data)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return JSONProblem.LONE_SURROGATE
        elif isinstance(item, dict):
            if depth > max_depth:
                return JSONProblem.TOO_DEEP
            for key, sub in item.items():
                stack.append((key, depth))
                stack.append((sub, depth + 1))
        elif isinstance(item, list):
            if depth > max_depth:
                return JSONProblem.TOO_DEEP
            stack.extend((sub, depth + 1) for sub in item)
    return None


def load_model_json(text: str, max_depth: int = MAX_JSON_DEPTH) -> tuple[Any, JSONProblem | None]:
    """Decode JSON written by a model: ``(value, None)``, or ``(None, problem)``. Never raises.

    Stricter than :func:`json.loads` (see the module docstring): no ``NaN`` / ``Infinity``, no lone
    surrogates in any string, at most ``max_depth`` nested arrays/objects. Time is linear in ``text``.
    A number too large for a float (``1e999``) is valid JSON and decodes to ``inf``, as in ``json``.
    """
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        return None, JSONProblem.TOO_DEEP
    except (ValueError, TypeError):
        return None, JSONProblem.INVALID
    problem = _check_decoded(value, max_depth)
    return (None, problem) if problem is not None else (value, None)


def find_block(text: str, open_tag: str, close_tag: str) -> str | None:
    """The body of the first ``open_tag ... close_tag`` block (the first close after the first open),
    or ``None``; equal to the first match of the lazy regex ``open(.*?)close`` in linear time."""
    start = text.find(open_tag)
    if start == -1:
        return None
    start += len(open_tag)
    end = text.find(close_tag, start)
    return None if end == -1 else text[start:end]


_JSON_PARSE_ERROR = {
    JSONProblem.INVALID: ParseError.INVALID_JSON,
    JSONProblem.LONE_SURROGATE: ParseError.INVALID_UNICODE,
    JSONProblem.TOO_DEEP: ParseError.JSON_TOO_DEEP,
}


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool ``name`` and its decoded ``arguments`` object."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedOutput:
    """Result of :func:`parse_tool_calls`.

    ``calls``: the calls in order (empty on error). ``final_answer``: the stripped text outside the
    blocks, ``None`` if empty or on error. ``error``: ``None`` or one :class:`ParseError`.
    """

    calls: list[ToolCall] = field(default_factory=list)
    final_answer: str | None = None
    error: ParseError | None = None


def reasoning_text(text: str) -> str | None:
    """The body of the first complete ``<think>...</think>`` block of a model output, stripped of
    surrounding whitespace; ``None`` without one. What the judge's step view shows as the step's
    reasoning (``envace.train.judge.judge_transcript``)."""
    found = find_block(text, THINK_OPEN, THINK_CLOSE)
    return None if found is None else found.strip()


def strip_think(text: str) -> str | None:
    """Remove reasoning; ``None`` if the think tags are unbalanced (the one think-block rule of envace: the
    ACT parser, the judge's verdict, the self-evaluation and the empty-response check all use it).

    Removes the leftmost complete ``<think>...</think>`` blocks one after the other (what
    ``re.sub("<think>.*?</think>", "", text)`` does), with ``str.find`` so that the time is linear: an
    opening tag without a closing one after it ends the scan, since no later one can have one either.
    """
    first_close = text.find(THINK_CLOSE)
    first_open = text.find(THINK_OPEN)
    if first_close != -1 and (first_open == -1 or first_close < first_open):
        text = text[first_close + len(THINK_CLOSE) :]
    kept: list[str] = []
    pos = 0
    while True:
        start = text.find(THINK_OPEN, pos)
        if start == -1:
            break
        end = text.find(THINK_CLOSE, start + len(THINK_OPEN))
        if end == -1:
            return None  # an unclosed <think>
        kept.append(text[pos:start])
        pos = end + len(THINK_CLOSE)
    kept.append(text[pos:])
    text = "".join(kept)
    if THINK_OPEN in text or THINK_CLOSE in text:
        return None
    return text


def _decode_call(body: str, parameters_key: bool = True) -> ToolCall | ParseError:
    """Decode one block body into a call, or the error code."""
    obj, problem = load_model_json(body)
    if problem is not None:
        return _JSON_PARSE_ERROR[problem]
    if not isinstance(obj, dict):
        return ParseError.CALL_NOT_OBJECT
    if "name" not in obj:
        return ParseError.MISSING_NAME
    name = obj["name"]
    if not isinstance(name, str):
        return ParseError.NAME_NOT_STRING
    if not name:
        return ParseError.EMPTY_NAME
    allowed = ("name", "arguments", "parameters") if parameters_key else ("name", "arguments")
    if any(key not in allowed for key in obj):
        return ParseError.UNEXPECTED_KEY
    if parameters_key and obj.get("parameters") is not None:
        arguments = obj["parameters"]  # authors' tool_parser.py: "parameters" first, then "arguments"
    else:
        arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        arguments, problem = load_model_json(arguments, MAX_JSON_DEPTH - 1)
        if problem == JSONProblem.INVALID:
            return ParseError.ARGUMENTS_NOT_OBJECT
        if problem is not None:
            return _JSON_PARSE_ERROR[problem]
    if not isinstance(arguments, dict):
        return ParseError.ARGUMENTS_NOT_OBJECT
    return ToolCall(name=name, arguments=arguments)


def parse_tool_calls(text: str, *, parameters_key: bool = True) -> ParsedOutput:
    """Parse one model output into calls and/or a final answer. Never raises.

    Args:
        text: the decoded model output of one ACT turn (no chat-template markers such as ``<|im_end|>``).
        parameters_key: accept ``"parameters"`` as the arguments key (authors' default); ``False``: it is
            ``UNEXPECTED_KEY`` (ours before).

    Returns:
        :class:`ParsedOutput`; see the module docstring for the conventions.
    """
    stripped = strip_think(text)
    if stripped is None:
        return ParsedOutput(error=ParseError.BAD_THINK_BLOCK)
    outside: list[str] = []
    bodies: list[str] = []
    inside = False
    for piece in _TAG_RE.split(stripped):
        if piece == TOOL_CALL_OPEN:
            if inside:
                return ParsedOutput(error=ParseError.NESTED_BLOCK)
            inside = True
        elif piece == TOOL_CALL_CLOSE:
            if not inside:
                return ParsedOutput(error=ParseError.STRAY_CLOSE_TAG)
            inside = False
        elif inside:
            bodies.append(piece)
        else:
            outside.append(piece)
    if inside:
        return ParsedOutput(error=ParseError.UNCLOSED_BLOCK)
    calls: list[ToolCall] = []
    for body in bodies:
        decoded = _decode_call(body, parameters_key)
        if isinstance(decoded, ParseError):
            return ParsedOutput(error=decoded)
        calls.append(decoded)
    answer = "".join(outside).strip() or None
    if not calls and answer is None:
        return ParsedOutput(error=ParseError.EMPTY_OUTPUT)
    return ParsedOutput(calls=calls, final_answer=answer)


def transcript(messages: Sequence[Mapping[str, Any]], *, separator: str = "\n\n", empty: str = "(empty)",
               call_prefix: str = "", name_tools: bool = False) -> str:
    """Plain-text transcript of chat messages, the one serialiser of envace: per message a ``[role]``
    header (``[tool NAME]`` for a named tool message with ``name_tools``), its content, and each tool call
    as JSON ``{"name", "arguments"}`` after ``call_prefix``; messages joined by ``separator``; ``empty``
    when there are none. Its callers keep their own separators (they are parts of prompts): the
    rehearsal prompt and the judge ``"\n\n"``, test-time scaling ``"\n"``."""
    parts = []
    for message in messages:
        role = message.get("role", "?")
        if name_tools and role == "tool" and message.get("name"):
            role = f"tool {message['name']}"
        lines = [f"[{role}]"]
        if message.get("content"):
            lines.append(str(message["content"]))
        for tc in message.get("tool_calls") or []:
            fn = tc.get("function", tc)
            lines.append(call_prefix + json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")},
                                                  ensure_ascii=False))
        parts.append("\n".join(lines))
    return separator.join(parts) if parts else empty


def render_tool_call(call: ToolCall) -> str:
    """The hermes block for one call, as Qwen3's chat template renders it.

    Returns ``'<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>'`` (no trailing newline).
    """
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    body = _PROTOCOL_TAG_RE.sub(r"\\u003c", body)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def assistant_message(content: str, calls: list[ToolCall] | None = None) -> dict[str, Any]:
    """An OpenAI-style assistant message; ``calls`` become ``tool_calls`` entries for the template."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    return message


def tool_message(content: str, name: str | None = None) -> dict[str, Any]:
    """An OpenAI-style tool (observation) message."""
    message: dict[str, Any] = {"role": "tool", "content": content}
    if name is not None:
        message["name"] = name
    return message


class ChatTemplateTokenizer(Protocol):
    """The part of a Hugging Face tokenizer this package uses."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], **kwargs: Any) -> str: ...


def render_chat(
    tokenizer: ChatTemplateTokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    tokenize: bool = False,
    **template_kwargs: Any,
) -> str | list[int]:
    """Render ``messages`` (and OpenAI-style ``tools``) through the tokenizer's own chat template.

    Returns the prompt text, or with ``tokenize=True`` its token ids (shape ``(L,)``, a ``list[int]``),
    encoded without extra special tokens so they equal the ids of the rendered text.
    ``template_kwargs`` (e.g. ``enable_thinking``) are passed to the template.
    """
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **template_kwargs
    )
    if not tokenize:
        return text
    return tokenizer.encode(text, add_special_tokens=False)


_DELTA_SENTINEL = "ENVACE_DELTA_SENTINEL"


class ChatTokens:
    """The token ids of one chat context that only grows (an ACT context or a REHEARSE context).

    The first prompt is rendered by the tokenizer's chat template with the generation prompt. After that
    the ids are only extended, never re-rendered:
    - :meth:`append_generated` appends a model's tokens exactly as generated;
    - :meth:`append_messages` appends the template's rendering of new non-assistant messages (tool
      observations, user turns) plus the next generation prompt, and returns those delta ids.

    The delta is taken from the template itself: it renders ``[user, assistant(SENTINEL), *messages]``
    with the generation prompt and keeps the text after the sentinel's turn end (``turn_end``, by default
    the tokenizer's eos token, ``<|im_end|>`` for Qwen3). Using a sentinel rather than a rendered prefix
    keeps this correct for Qwen3-style templates that render the last assistant turn differently (an
    empty ``<think>`` block) from earlier ones. The dummy conversation is rendered without tools (a
    simplification: Qwen3-style templates render tool and user messages independently of the tool list).
    If the context does not end with ``turn_end`` (a generation stopped at its token limit), the delta
    starts with ``turn_end`` so that the next message opens a well-formed turn.

    Attributes:
        ids: the context token ids, shape ``(L,)``.
        encoded_tokens: how many token ids this object has produced by encoding text so far (the first
            prompt plus every delta); model tokens are never encoded.
    """

    def __init__(
        self,
        tokenizer: ChatTemplateTokenizer,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        turn_end: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        end = turn_end if turn_end is not None else getattr(tokenizer, "eos_token", None)
        if not end:
            raise ValueError("turn_end is required when the tokenizer has no eos_token")
        self.turn_end: str = end
        self.turn_end_ids = tokenizer.encode(end, add_special_tokens=False)
        first = render_chat(tokenizer, messages, tools, add_generation_prompt=True, tokenize=True,
                            **self.template_kwargs)
        self.ids: list[int] = list(first)
        self.encoded_tokens = len(self.ids)

    def append_generated(self, token_ids: list[int]) -> None:
        """Append model tokens as generated."""
        self.ids.extend(token_ids)

    def ends_turn(self) -> bool:
        """Whether the context currently ends with the turn-end tokens."""
        n = len(self.turn_end_ids)
        return self.ids[-n:] == self.turn_end_ids

    def delta_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Ids that :meth:`append_messages` would append for ``messages`` (no state change)."""
        dummy = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _DELTA_SENTINEL}]
        text = self.tokenizer.apply_chat_template(
            dummy + messages, add_generation_prompt=True, tokenize=False, **self.template_kwargs
        )
        after = text.index(_DELTA_SENTINEL) + len(_DELTA_SENTINEL)
        start = text.index(self.turn_end, after) + len(self.turn_end)
        delta = text[start:] if self.ends_turn() else self.turn_end + text[start:]
        return self.tokenizer.encode(delta, add_special_tokens=False)

    def append_messages(self, messages: list[dict[str, Any]]) -> list[int]:
        """Append the rendering of ``messages`` plus the next generation prompt; returns the delta ids."""
        delta = self.delta_ids(messages)
        self.ids.extend(delta)
        self.encoded_tokens += len(delta)
        return delta
