"""Shared fixtures for the core tests: the tiny tokenizer, a scripted backend, a sample tool set."""

from __future__ import annotations

from typing import Any

import pytest

from envace.tiny_model import build_tiny_tokenizer

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


class ScriptedBackend:
    """Generate backend that replies with scripted texts, in call order, and records every prompt.

    Each text is encoded and followed by the eos id unless ``eos=False`` was given with it as a
    ``(text, False)`` tuple. Log-probs are ``-0.5`` per token.
    """

    def __init__(self, tokenizer: Any, texts: list[str | tuple[str, bool]]) -> None:
        self.tokenizer = tokenizer
        self.texts = list(texts)
        self.prompts: list[list[int]] = []
        self.params: list[dict[str, Any]] = []

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        self.prompts.append(list(prompt_ids))
        self.params.append(dict(sampling_params))
        item = self.texts.pop(0)
        text, eos = item if isinstance(item, tuple) else (item, True)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        ids = ids[: sampling_params["max_tokens"]]
        if eos and len(ids) < sampling_params["max_tokens"]:
            ids.append(self.tokenizer.eos_token_id)
        return ids, [-0.5] * len(ids)


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


@pytest.fixture
def scripted(tokenizer: Any):
    """Factory: ``scripted(texts) -> ScriptedBackend``."""

    def make(texts: list[str | tuple[str, bool]]) -> ScriptedBackend:
        return ScriptedBackend(tokenizer, texts)

    return make
