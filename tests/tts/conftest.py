"""Shared test doubles of the TTS and fidelity tests: a task stand-in and a spy episode (the tiny
tokenizer, scripted backends and the weather tool are in ``tests/fixtures.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envace.core.environment import Score
from envace.core.tools import ToolCall
from tests.fixtures import WEATHER_TOOL

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@dataclass
class Task:
    """Stand-in for ``envace.core.environment.Task`` (only the fields TTS reads)."""

    system: str | None
    first_user: str
    tools: list[dict[str, Any]] = field(default_factory=lambda: [WEATHER_TOOL])


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
