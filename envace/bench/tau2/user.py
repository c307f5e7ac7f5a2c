"""tau2 user-simulator backends: the :class:`UserModel` interface, tau2's simulator prompt over an
OpenAI-compatible endpoint (:class:`OpenAIUserModel`) and a scripted one for tests and the gold replay.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from envace.bench.tau2.data import DEFAULT_USER_TEMPERATURE
from envace.common.openai_client import openai_client
from envace.core.environment import Endpoint, EpisodeError
from envace.core.tools import ToolCall

# --------------------------------------------------------------------------------------------------
# User simulator backends


@dataclass
class UserTurn:
    """One user-simulator output: text and/or calls of the user's own (device) tools."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


class UserModel(Protocol):
    """The LLM behind the simulated user.

    ``messages`` is the chat from the user's side (OpenAI-style: system = tau2's user prompt, ``user`` =
    the agent's texts, ``assistant`` = earlier user-simulator outputs, ``tool`` = user tool results);
    ``tools`` the user's tool schemas or ``None``.
    """

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 seed: int) -> UserTurn:
        ...


class OpenAIUserModel:
    """A user simulator served behind an OpenAI-compatible endpoint (``vllm serve``).

    Tool-call arguments that are not a JSON object are passed on as ``{"__invalid_arguments__": text}``
    (tau2 then answers with an error observation). Verified here only against a stand-in client.
    """

    def __init__(self, endpoint: Endpoint, temperature: float = DEFAULT_USER_TEMPERATURE,
                 client: Any | None = None, timeout_s: float = 600.0, max_tokens: int | None = None) -> None:
        if client is None:
            client = openai_client(endpoint.base_url, endpoint.api_key, timeout_s)
        self.endpoint = endpoint
        self.temperature = temperature
        self.client = client
        self.max_tokens = max_tokens

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 seed: int) -> UserTurn:
        kwargs: dict[str, Any] = {"model": self.endpoint.model, "messages": messages,
                                  "temperature": self.temperature, "seed": seed}
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
        if tools:
            kwargs["tools"] = tools
        response = self.client.chat.completions.create(**kwargs)
        message = response.choices[0].message
        calls = []
        for tc in message.tool_calls or []:
            try:
                arguments = json.loads(tc.function.arguments or "{}")
            except json.JSONDecodeError:
                arguments = None
            if not isinstance(arguments, dict):
                arguments = {"__invalid_arguments__": str(tc.function.arguments)}
            calls.append(ToolCall(name=tc.function.name, arguments=arguments))
        return UserTurn(content=message.content, tool_calls=calls)


class ScriptedUserModel:
    """Replies from a fixed list (tests, gold replay); records every chat it was shown."""

    def __init__(self, turns: Sequence[UserTurn]) -> None:
        self._turns: Iterator[UserTurn] = iter(list(turns))
        self.seen: list[list[dict[str, Any]]] = []

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 seed: int) -> UserTurn:
        self.seen.append(json.loads(json.dumps(messages)))
        try:
            return next(self._turns)
        except StopIteration:
            raise EpisodeError("scripted user model has no reply left") from None
