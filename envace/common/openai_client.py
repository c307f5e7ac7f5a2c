"""The synchronous OpenAI SDK client that envace's judges and simulated users talk through.

One place builds ``openai.OpenAI`` for an OpenAI-compatible endpoint (``vllm serve`` or a hosted API):
the CM2 checklist judge (:class:`envace.train.judge.ChecklistJudge`), tau2's user simulator
(:class:`envace.bench.tau2.user.OpenAIUserModel`) and VitaBench's judge
(:class:`envace.bench.vitabench.judge.OpenAIJudge`). ``openai`` is imported only when a client is built, so
importing this module costs nothing (it is imported by modules that verl's reward workers load).
"""

from __future__ import annotations

from typing import Any


def openai_client(base_url: str, api_key: str, timeout_s: float, *, max_retries: int | None = None) -> Any:
    """``openai.OpenAI(base_url=..., api_key=..., timeout=timeout_s)``.

    ``max_retries``: the SDK's own retries; ``None`` keeps the SDK's default, ``0`` turns them off (for a
    caller that counts and paces its retries itself).
    """
    import openai

    retries = {} if max_retries is None else {"max_retries": max_retries}
    return openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, **retries)
