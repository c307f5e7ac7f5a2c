"""Fixtures for the evaluation tests: a toy benchmark adapter and the FinMCP fixture path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envace.core.environment import Score, Services, Task
from envace.core.tools import ToolCall

DATA = Path(__file__).resolve().parents[1] / "data"


class ToyEpisode:
    """Counts calls to ``ping``; one follow-up user turn; score = 1 if ``ping`` was called twice."""

    def __init__(self, task: Task, fail: str | None) -> None:
        self.task = task
        self.fail = fail
        self.pings = 0
        self.replies = 0

    def step(self, call: ToolCall) -> str:
        if self.fail == "step":
            raise RuntimeError("environment exploded")
        if call.name != "ping":
            return f"error: unknown tool {call.name}"
        self.pings += 1
        return "pong"

    def user_reply(self, assistant_text: str) -> str | None:
        self.replies += 1
        return "again" if self.replies == 1 else None

    def score(self) -> Score:
        return Score(score=float(self.pings == 2), subscores={"pings": min(1.0, self.pings / 2)})


class ToyAdapter:
    name = "toy"

    def __init__(self, n: int = 3, fail: dict[str, str] | None = None) -> None:
        self.n = n
        self.fail = fail or {}
        self.episodes: list[tuple[str, int]] = []

    def versions(self) -> dict[str, str]:
        return {"toy": "1"}

    def load_tasks(self, splits: list[str], limit: int | None) -> list[Task]:
        tools = [{"type": "function", "function": {"name": "ping", "description": "ping",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        return [Task(f"t{i}", "s", "sys", "hello", tools, {}) for i in range(limit or self.n)]

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> Any:
        self.episodes.append((task.task_id, sample))
        return ToyEpisode(task, self.fail.get(task.task_id))


@pytest.fixture
def toy() -> ToyAdapter:
    return ToyAdapter()


@pytest.fixture
def toy_cls() -> type[ToyAdapter]:
    return ToyAdapter


@pytest.fixture(scope="session")
def finmcp_fixture() -> Path:
    return DATA / "finmcp" / "fixture.json"
