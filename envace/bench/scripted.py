"""A character-level chat tokenizer and a scripted backend for self-checks and tests.

Implemented: :class:`CharTokenizer` — token id = Unicode code point; a minimal Qwen3-style chat
rendering of our own (``<|im_start|>role ... <|im_end|>``, tools listed as JSON in the system turn, tool
results wrapped in ``<tool_response>``); ``eos_token`` = ``<|im_end|>``, so the rollout loop's turn end
is that 10-character sequence. :class:`ScriptedBackend` — replies with fixed texts in order (each followed
by ``<|im_end|>``), log-probs 0; after the script it answers ``"done"``.

Why: the self-checks replay gold calls through the full runner path (episode, rollout loop, parser,
structured dispatch, scorer) 800 times; the tiny model's BPE tokenizer and Jinja template would dominate
that time without testing anything the self-check is about. Simplification: this is not the tokenizer of
any served model.
"""

from __future__ import annotations

import json
from array import array
from typing import Any

from envace.core.tools import render_tool_call

__all__ = ["CharTokenizer", "ScriptedBackend", "script_for_calls"]

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


class CharTokenizer:
    """Code-point tokenizer with a small chat template (see the module docstring)."""

    eos_token = IM_END

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return array("I", text.encode("utf-32-le")).tolist()

    def decode(self, token_ids: list[int], **kwargs: Any) -> str:
        return array("I", token_ids).tobytes().decode("utf-32-le")

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        tools = kwargs.get("tools")
        parts = []
        msgs = list(conversation)
        system = ""
        if msgs and msgs[0]["role"] == "system":
            system = msgs.pop(0)["content"] or ""
        if tools:
            system += "\n# Tools\n" + "\n".join(json.dumps(t, sort_keys=True) for t in tools)
        if system:
            parts.append(f"{IM_START}system\n{system}{IM_END}\n")
        for m in msgs:
            if m["role"] == "assistant":
                body = m.get("content") or ""
                for call in m.get("tool_calls") or []:
                    fn = call.get("function", call)
                    args = fn.get("arguments", {})
                    if isinstance(args, str):
                        args = json.loads(args)
                    body += "\n<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": args}) + \
                        "\n</tool_call>"
                parts.append(f"{IM_START}assistant\n{body}{IM_END}\n")
            elif m["role"] == "tool":
                parts.append(f"{IM_START}user\n<tool_response>\n{m['content']}\n</tool_response>{IM_END}\n")
            else:
                parts.append(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n")
        if kwargs.get("add_generation_prompt"):
            parts.append(f"{IM_START}assistant\n")
        text = "".join(parts)
        return self.encode(text) if kwargs.get("tokenize") else text


class ScriptedBackend:
    """Returns the texts of ``script`` in order, each ending the turn (cut at ``max_tokens``, like a
    real server); then ``"done"``."""

    def __init__(self, script: list[str], tokenizer: CharTokenizer | None = None) -> None:
        self.script = list(script)
        self.tokenizer = tokenizer or CharTokenizer()
        self.calls = 0

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        """Next scripted reply as ids (shape ``(T,)``) with zero log-probs."""
        text = self.script[self.calls] if self.calls < len(self.script) else "done"
        self.calls += 1
        ids = self.tokenizer.encode(text + IM_END)[: int(sampling_params.get("max_tokens", 10**9))]
        return ids, [0.0] * len(ids)


def script_for_calls(turns: list[list[Any]], final_text: str = "done") -> list[str]:
    """A script that, per user turn, makes that turn's calls in one message, then answers in text.

    ``turns``: per user turn, a list of :class:`envace.core.tools.ToolCall` (an empty list = answer at once).
    """
    script = []
    for calls in turns:
        if calls:
            script.append("\n".join(render_tool_call(c) for c in calls))
        script.append(final_text)
    return script
