"""Test doubles shared by the test packages: the tiny tokenizer, a scripted backend, the weather tool.

- ``tokenizer`` (pytest fixture, session scope): the tiny model's tokenizer
  (:func:`envace.serve.tiny_model.build_tiny_tokenizer`). ``tests/conftest.py`` registers this module as a
  plugin, so every test can request it (and ``scripted``) by name.
- :class:`ScriptedBackend`: a generate backend (``generate(prompt_ids, sampling_params)``) replying with
  scripted texts in call order and recording every prompt; :class:`ScriptedServerManager` is the same
  behind verl's server-manager interface. ``scripted`` (pytest fixture): ``scripted(texts)`` builds one
  on ``tokenizer``.
- :func:`weather_tool`: the ``get_weather`` tool schema (``WEATHER_TOOL``: city only;
  ``WEATHER_TOOL_WITH_UNIT``: plus a ``unit`` enum, which the rehearsal validation tests exercise).
- :func:`markdown_table`: the rows of a Markdown table in a doc, found by its header, and
  :func:`config_values`: the config's values at a key path (the docs' tables that tests check against
  the config).
- :class:`TtsTask`, :class:`SpyEpisode`, ``CALL``: the TTS and fidelity tests' task stand-in, an episode
  that logs every call, and one weather tool call in the ACT format.

Not to be confused with :class:`envace.bench.scripted.ScriptedBackend`, the project's own scripted
backend over a character tokenizer (self-checks and the benchmark tests use it): that one answers
``"done"`` after its script, with log-probs 0; this one fails when its script runs out, so a test that
generates more often than it scripted fails.

Other imports: ``from tests.fixtures import ScriptedBackend, WEATHER_TOOL``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from envace.core.environment import Score
from envace.core.rollout import RolloutConfig
from envace.core.tools import ToolCall

__all__ = [
    "WEATHER_TOOL",
    "WEATHER_TOOL_WITH_UNIT",
    "ScriptedBackend",
    "ScriptedServerManager",
    "scripted",
    "tokenizer",
    "weather_tool",
]


def weather_tool(*, unit: bool = False) -> dict[str, Any]:
    """A fresh ``get_weather(city[, unit])`` tool schema in the OpenAI function format."""
    properties: dict[str, Any] = {"city": {"type": "string"}}
    if unit:
        properties["unit"] = {"enum": ["c", "f"]}
    return {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }


WEATHER_TOOL: dict[str, Any] = weather_tool()
WEATHER_TOOL_WITH_UNIT: dict[str, Any] = weather_tool(unit=True)


class ScriptedBackend:
    """Generate backend that replies with scripted texts, in call order, and records every call.

    Each text is encoded and cut at ``sampling_params["max_tokens"]``, like a real server; the eos id
    follows it if there is room, unless the text was given as ``(text, False)``. Log-probs are ``-0.5``
    per token. Running out of texts raises ``AssertionError``. Records: ``prompt_ids`` (the prompts as
    ids), ``prompts`` (decoded, special tokens kept), ``params`` (the sampling params),
    ``context_lengths`` (prompt + reply ids of each call); with ``log``, each call also appends
    ``(name, decoded prompt)`` to it (a log shared with other doubles orders their calls).
    """

    def __init__(self, tokenizer: Any, texts: list[str | tuple[str, bool]], *, name: str = "backend",
                 log: list[tuple[str, Any]] | None = None) -> None:
        self.tokenizer = tokenizer
        self.texts = list(texts)
        self.name = name
        self.log = log
        self.prompt_ids: list[list[int]] = []
        self.prompts: list[str] = []
        self.params: list[dict[str, Any]] = []
        self.context_lengths: list[int] = []

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        self.prompt_ids.append(list(prompt_ids))
        self.prompts.append(prompt)
        self.params.append(dict(sampling_params))
        if self.log is not None:
            self.log.append((self.name, prompt))
        if not self.texts:
            raise AssertionError(f"backend {self.name} ran out of scripted replies")
        item = self.texts.pop(0)
        text, eos = item if isinstance(item, tuple) else (item, True)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        ids = ids[: sampling_params["max_tokens"]]
        if eos and len(ids) < sampling_params["max_tokens"]:
            ids.append(self.tokenizer.eos_token_id)
        self.context_lengths.append(len(prompt_ids) + len(ids))
        return ids, [-0.5] * len(ids)


class ScriptedServerManager(ScriptedBackend):
    """:class:`ScriptedBackend` behind verl's server-manager interface:
    ``await generate(request_id, prompt_ids=..., sampling_params=...)`` returns a verl ``TokenOutput``."""

    async def generate(  # type: ignore[override]
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        ids, logprobs = await super().generate(prompt_ids, sampling_params)
        return TokenOutput(token_ids=ids, log_probs=logprobs)


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    """The tiny model's tokenizer (built once per session; nothing mutates it)."""
    from envace.serve.tiny_model import build_tiny_tokenizer  # torch and transformers: only when asked for

    return build_tiny_tokenizer()


@pytest.fixture
def scripted(tokenizer: Any):
    """Factory: ``scripted(texts) -> ScriptedBackend`` on the tiny tokenizer."""

    def make(texts: list[str | tuple[str, bool]]) -> ScriptedBackend:
        return ScriptedBackend(tokenizer, texts)

    return make


# --- TTS and fidelity doubles: a task stand-in and a spy episode
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@dataclass
class TtsTask:
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


def markdown_table(text: str, columns: list[str], source: str) -> list[dict[str, str]]:
    """The rows (``{column: cell}``) of the first Markdown table in ``text`` whose header is ``columns``;
    an AssertionError naming ``source`` when there is none or a row has another number of cells."""
    lines = [line.strip() for line in text.splitlines()]
    split = lambda line: [c.strip() for c in line.strip("|").split("|")]  # noqa: E731
    for i, line in enumerate(lines):
        if line.startswith("|") and split(line) == columns:
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                cells = split(row)
                assert len(cells) == len(columns), f"{source}: {len(cells)} cells, not {len(columns)}: {row}"
                rows.append(dict(zip(columns, cells, strict=True)))
            return rows
    raise AssertionError(f"{source} has no table with the columns {columns}")


def config_values(cfg: Any, path: Sequence[str]) -> list[Any]:
    """Values at ``path`` in the config; a ``<name>`` segment matches every key of that map."""
    if not path:
        return [cfg]
    head, rest = path[0], path[1:]
    if not isinstance(cfg, dict):
        return []
    if head.startswith("<") and head.endswith(">"):
        return [v for sub in cfg.values() for v in config_values(sub, rest)]
    return config_values(cfg[head], rest) if head in cfg else []


def eval_rules(**kwargs: Any) -> RolloutConfig:
    """A :class:`RolloutConfig` with the evaluation's episode rules unless ``kwargs`` set them: the whole
    episode under one token budget, every ACT turn counted toward ``max_turns``, the chat template's own
    thinking default, no REHEARSE context cut. The rollout tests are written against these rules;
    ``RolloutConfig()`` alone has the training defaults (``EPISODE_DEFAULTS``)."""
    rules: dict[str, Any] = {"context_budget": "episode", "turn_cap": "every_turn", "template_kwargs": {},
                             "rehearse_truncation": "none"}
    return RolloutConfig(**{**rules, **kwargs})
