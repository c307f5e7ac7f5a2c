"""Shared fixtures for the TTS and fidelity tests: tiny tokenizer, scripted backends, a spy episode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from envace.bench.base import Score
from envace.tiny_model import build_tiny_tokenizer
from envace.tools import ToolCall

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@dataclass
class Task:
    """Stand-in for ``envace.bench.base.Task`` (only the fields TTS reads)."""

    system: str | None
    first_user: str
    tools: list[dict[str, Any]] = field(default_factory=lambda: [WEATHER_TOOL])


class ScriptedBackend:
    """Replies with scripted texts in call order; logs ``(name, decoded prompt)`` into a shared ``log``."""

    def __init__(self, name: str, tokenizer: Any, texts: list[str], log: list[tuple[str, Any]]) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self.texts = list(texts)
        self.log = log
        self.prompts: list[str] = []
        self.context_lengths: list[int] = []  # prompt + reply token ids of every call
        self.params: list[dict[str, Any]] = []

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]):
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        self.prompts.append(prompt)
        self.params.append(dict(sampling_params))
        self.log.append((self.name, prompt))
        if not self.texts:
            raise AssertionError(f"backend {self.name} ran out of scripted replies")
        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)
        ids = ids[: sampling_params["max_tokens"]]
        if len(ids) < sampling_params["max_tokens"]:
            ids.append(self.tokenizer.eos_token_id)
        self.context_lengths.append(len(prompt_ids) + len(ids))
        return ids, [-0.5] * len(ids)


class SpyEpisode:
    """A real-episode stand-in that logs every call into the shared ``log``."""

    def __init__(self, log: list[tuple[str, Any]], replies: list[str | None] | None = None) -> None:
        self.log = log
        self.replies = list(replies or [None])
        self.calls: list[ToolCall] = []

    def step(self, call: ToolCall) -> str:
        self.log.append(("env.step", call))
        self.calls.append(call)
        return '{"temperature": 18}'

    def user_reply(self, assistant_text: str) -> str | None:
        self.log.append(("env.user_reply", assistant_text))
        return self.replies.pop(0) if self.replies else None

    def score(self) -> Score:
        self.log.append(("env.score", None))
        return Score(score=1.0, subscores={}, extra={"calls": len(self.calls)})


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return build_tiny_tokenizer()
