"""The benchmark adapter protocol shared by every evaluation runner.

Implemented: the data types a benchmark adapter exchanges with :mod:`envace.cli.eval` —
:class:`Task` (one benchmark item), :class:`Score` (its result in ``[0, 1]`` plus sub-scores),
:class:`Episode` (ONE isolated environment instance per ``(task, sample, seed)``; it is the
:class:`envace.core.rollout.Environment` of a ``Mode.REAL`` rollout), :class:`Endpoint` / :class:`Services`
(OpenAI-compatible servers the runner started for a user simulator or judge) and the
:class:`BenchmarkAdapter` protocol.

How the runner drives an episode: the agent chat starts with ``system`` + ``first_user``; the core
rollout loop runs with the episode as the environment until the agent answers in text;
``episode.user_reply(text)`` gives the next user message (``None`` = conversation over), which is appended
and the loop continues; finally ``episode.score()``. Exceptions raised inside an episode become a failed
sample with a reason (:class:`EpisodeError` may be raised to give a clean reason), never a crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from envace.core.tools import ToolCall

__all__ = [
    "Task",
    "Score",
    "Episode",
    "Endpoint",
    "Services",
    "BenchmarkAdapter",
    "EpisodeError",
]


class EpisodeError(RuntimeError):
    """An episode cannot continue (bad task data, missing service, ...): the sample fails with this
    message as its reason."""


@dataclass
class Task:
    """One benchmark item."""

    task_id: str  # unique within the benchmark
    split: str  # category / domain (config benchmarks.<b>.splits)
    system: str | None  # system prompt for the agent, if the benchmark has one
    first_user: str  # the first user message
    tools: list[dict[str, Any]]  # OpenAI-style tool schemas
    meta: dict[str, Any] = field(default_factory=dict)  # benchmark-specific (ground truth, scenario, ...)


@dataclass
class Score:
    """The result of one episode."""

    score: float  # in [0, 1]
    subscores: dict[str, float] = field(default_factory=dict)  # e.g. FinMCP tp/tr/tf1
    extra: dict[str, Any] = field(default_factory=dict)  # benchmark-specific details


class Episode(Protocol):
    """ONE isolated environment instance per ``(task, sample, seed)``."""

    def step(self, call: ToolCall) -> str:
        """Execute a parsed call and return the observation text; never raises for bad calls (returns an
        error text instead). Same signature as :class:`envace.core.rollout.Environment`."""
        ...

    def user_reply(self, assistant_text: str) -> str | None:
        """The next user message after the agent's final text; ``None`` = conversation over."""
        ...

    def score(self) -> Score: ...


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint (``base_url`` ends in ``/v1``)."""

    base_url: str
    model: str
    api_key: str = "EMPTY"


@dataclass
class Services:
    """OpenAI-compatible endpoints the runner started (or ``None`` when the benchmark needs none)."""

    user_simulator: Endpoint | None = None
    judge: Endpoint | None = None


class BenchmarkAdapter(Protocol):
    """A benchmark: its task list and a factory of isolated episodes."""

    name: str

    def versions(self) -> dict[str, str]:
        """Pinned package / data versions, recorded in manifests."""
        ...

    def load_tasks(self, splits: list[str], limit: int | None) -> list[Task]:
        """The tasks of ``splits`` in a deterministic order; at most ``limit`` per split if given."""
        ...

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> Episode: ...
