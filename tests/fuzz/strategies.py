"""Hypothesis strategies for the fuzz suite: model-written text and JSON, hostile Python values.

- :data:`any_char` / :func:`any_text`: any code point, lone surrogates included (Hypothesis leaves the
  surrogate category out by default; a model's JSON escape ``\\ud800`` decodes to exactly such a str).
- :data:`json_values`: what ``json.loads`` can return from model text (NaN and infinities included).
- :func:`nested`: a list nested ``depth`` times, built without recursion.
- :data:`hostile_values`: JSON values plus what else code may put into a result line (bytes, sets,
  tuples, objects, numbers too large to print, deep nesting).
- :func:`tool_call_text`: one ``<tool_call>`` block whose body is ``{"name", "arguments"}`` JSON.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import strategies as st

SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
any_char = st.one_of(st.characters(), SURROGATE)
TAGS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<execution_result>", "</execution_result>",
        "<evaluation>", "</evaluation>", "<memory>", "</memory>"]


def any_text(max_size: int = 20) -> st.SearchStrategy[str]:
    return st.text(alphabet=any_char, max_size=max_size)


def nested(depth: int, leaf: Any = 0) -> Any:
    """``[[...[leaf]...]]`` with ``depth`` lists (iterative)."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def depth_of(value: Any) -> int:
    """Nesting depth of lists/dicts (0 for a scalar), iteratively."""
    best, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            best = max(best, depth)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            best = max(best, depth)
            stack.extend((v, depth + 1) for v in item)
    return best


def strings_of(value: Any) -> list[str]:
    """Every str in a JSON-like value (keys included), iteratively."""
    out, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            out.extend(k for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return out


def has_surrogate(value: Any) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for s in strings_of(value) for c in s)


def has_non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), any_text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(any_text(8), children, max_size=4)),
    max_leaves=20,
)
deep_values = st.builds(nested, st.integers(0, 3000), json_scalars)


class _Opaque:
    def __repr__(self) -> str:
        return "<opaque \ud800>"


class _BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


odd_scalars = st.one_of(
    st.binary(max_size=8), st.frozensets(st.integers(), max_size=3),
    st.builds(_Opaque), st.builds(_BrokenRepr),
    st.sampled_from([5000, -5000]).map(lambda digits: int(math.copysign(1, digits)) * 10 ** abs(digits)),
)
hostile_values = st.recursive(
    st.one_of(json_scalars, odd_scalars, deep_values),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.one_of(any_text(8), st.integers(), st.booleans(), st.none(), st.floats()),
                        children, max_size=4),
    ),
    max_leaves=15,
)


@st.composite
def tool_call_text(draw: st.DrawFn, arguments: st.SearchStrategy[Any] = json_values) -> tuple[str, str, Any]:
    """``(text, name, arguments)``: a block as a model might write it, escapes and all, and the arguments
    that its JSON text decodes to.

    ``<`` is written as ``\\u003c`` inside the JSON (as :func:`envace.core.tools.render_tool_call` does) so
    that strings holding a tag do not end the block; ``ensure_ascii`` is drawn, so a lone surrogate
    appears either raw or as a ``\\udXXX`` escape.
    """
    name = draw(st.text(min_size=1, max_size=8))
    args = draw(st.dictionaries(any_text(8), arguments, max_size=3))
    ascii_only = draw(st.booleans())
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=ascii_only).replace("<", "\\u003c")
    # what the text means: escapes of a surrogate pair decode to one astral character
    return f"<tool_call>\n{body}\n</tool_call>", name, json.loads(body)["arguments"]
