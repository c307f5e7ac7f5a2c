"""The checklist judge client: verdicts of an LLM judge over an OpenAI-compatible endpoint, for the
checklist reward (:func:`envace.core.reward.checklist_reward`).

Judge client (:class:`ChecklistJudge`): an OpenAI-compatible chat endpoint (vLLM serving Qwen3-30B-A3B in
the paper config; temperature 0.6 / top_p 0.8 per the authors' script), prompt
``envace/core/prompts/checklist_judge_v1.yaml`` (ours). The reply must be a JSON object with a boolean
``"passed"`` (complete ``<think>...</think>`` blocks and surrounding whitespace are allowed, nothing else).
A malformed reply, a timeout, a connection or HTTP error is retried with exponential backoff up to
``max_retries`` times; after that the verdict is a *failure*, handled by ``failure_policy``:

- ``"fail"``: the item counts as not passed at that step (default);
- ``"skip_item"``: the item is removed from its turn and the remaining weights are rescaled to sum to 1
  (a turn left with no item is left out of the mean; an episode left with no turn is dropped);
- ``"drop_sample"``: the episode gets no reward (``None``); the trainer drops its rows.

Verdicts are cached in memory (optionally persisted as JSONL) under the sha256 of (prompt version,
judge model, rendered messages), so identical steps are judged once (the in-episode check of
``stop_on_required_failed`` and the episode reward share them). Every call, cache hit, retry,
malformed reply, timeout and final failure is counted in :class:`JudgeMetrics`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from envace.common.openai_client import openai_client
from envace.core.prompts import load_prompt
from envace.core.reward import reward_rules_from_env
from envace.core.tools import reasoning_text, strip_think, transcript

__all__ = ["FailurePolicy", "FAILURE_POLICIES", "JudgeConfig", "JudgeMetrics", "VERDICT_FORMAT",
           "verdict_format", "judge_config_from_env", "parse_verdict", "ChecklistJudge",
           "judge_transcript"]

FailurePolicy = Literal["fail", "skip_item", "drop_sample"]
FAILURE_POLICIES: tuple[str, ...] = ("fail", "skip_item", "drop_sample")


def judge_transcript(messages: list[dict[str, Any]], *, empty: str = "(empty)") -> str:
    """The authors' judge view of a conversation (their ``get_messages_str_v2``; our layout): every
    message under a ``[role]`` header, each assistant step as three fields, ``reasoning`` (its
    ``envace_reasoning``, else the first think block of its text), ``visible reply`` (its text without
    think blocks) and ``tool calls`` (JSON ``{"name", "arguments"}`` per call), each ``None`` when absent.
    The authors show a message without a think block as all reasoning; with thinking on (their runs)
    every message has one, and without it (ours at smoke scale) this view keeps the text as the reply."""
    parts = []
    for message in messages:
        role = message.get("role", "?")
        content = str(message.get("content") or "")
        if role != "assistant":
            parts.append(f"[{role}]\n{content}" if content else f"[{role}]")
            continue
        reasoning = message.get("envace_reasoning")
        if reasoning is None:
            reasoning = reasoning_text(content)
        visible = strip_think(content)
        visible = (content if visible is None else visible).strip()
        calls = [tc.get("function", tc) for tc in message.get("tool_calls") or []]
        calls_text = json.dumps([{"name": c.get("name"), "arguments": c.get("arguments")} for c in calls],
                                ensure_ascii=False) if calls else "None"
        parts.append(f"[assistant]\nreasoning: {reasoning or 'None'}\nvisible reply: {visible or 'None'}"
                     f"\ntool calls: {calls_text}")
    return "\n\n".join(parts) if parts else empty


@dataclass
class JudgeConfig:
    """Judge endpoint and policy. ``base_url`` e.g. ``http://host:8000/v1``."""

    base_url: str
    model: str
    api_key: str = "EMPTY"
    temperature: float = 0.6  # authors' script
    top_p: float = 0.8  # authors' script
    max_tokens: int = 6000  # authors' code (judge requests of the released environment)
    json_schema: bool = True  # authors' code: a strict json_schema response format for the verdict
    reason_max_chars: int | None = None  # ours, smoke scale: cap the verdict's "reason" (schema maxLength)
    max_retries: int = 3  # ours
    timeout_s: float = 120.0  # ours
    backoff_s: float = 1.0  # ours; doubles per retry
    failure_policy: FailurePolicy = "fail"  # ours
    max_concurrency: int = 16  # ours
    prompt_name: str = "checklist_judge_v3"  # RewardRules.judge_prompt; v2, v1: ours before
    cache_path: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)  # e.g. {"chat_template_kwargs": {...}}

    def __post_init__(self) -> None:
        if self.failure_policy not in FAILURE_POLICIES:
            raise ValueError(f"failure_policy must be one of {FAILURE_POLICIES}, got {self.failure_policy!r}")
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")


@dataclass
class JudgeMetrics:
    """Counters of one judge client (thread-safe increments via :meth:`add`)."""

    requests: int = 0
    cache_hits: int = 0
    retries: int = 0
    malformed: int = 0
    timeouts: int = 0
    errors: int = 0
    failures: int = 0
    dropped_samples: int = 0
    skipped_items: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for key, value in counts.items():
                setattr(self, key, getattr(self, key) + value)

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


#: The verdict's JSON schema, sent as a strict ``response_format`` (vLLM constrains decoding to it).
VERDICT_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "checklist_verdict",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"passed": {"type": "boolean"}, "reason": {"type": "string"}},
            "required": ["passed", "reason"],
            "additionalProperties": False,
        },
    },
}


def verdict_format(reason_max_chars: int | None = None) -> dict[str, Any]:
    """:data:`VERDICT_FORMAT`, with ``"reason"`` capped at ``reason_max_chars`` characters when given
    (``training.judge.reason_max_chars``; the smoke judge, a random-weight model, never closes the string
    otherwise: it ran to the token cap in every verdict; docs/measurements.md)."""
    if reason_max_chars is None:
        return VERDICT_FORMAT
    out = json.loads(json.dumps(VERDICT_FORMAT))
    out["json_schema"]["schema"]["properties"]["reason"]["maxLength"] = int(reason_max_chars)
    return out


def judge_config_from_env(env: Any) -> JudgeConfig:
    """The judge settings of a verl reward worker: ``ENVACE_JUDGE_*`` (set by
    :func:`envace.train.verl_ext.launch.judge_env` from ``training.judge``)."""
    return JudgeConfig(
        base_url=env["ENVACE_JUDGE_BASE_URL"], model=env["ENVACE_JUDGE_MODEL"],
        temperature=float(env.get("ENVACE_JUDGE_TEMPERATURE", 0.6)),
        top_p=float(env.get("ENVACE_JUDGE_TOP_P", 0.8)),
        failure_policy=env.get("ENVACE_JUDGE_FAILURE_POLICY", "fail"),
        max_retries=int(env.get("ENVACE_JUDGE_MAX_RETRIES", 3)),
        timeout_s=float(env.get("ENVACE_JUDGE_TIMEOUT_S", 120)),
        max_tokens=int(env.get("ENVACE_JUDGE_MAX_TOKENS", 6000)),
        max_concurrency=int(env.get("ENVACE_JUDGE_MAX_CONCURRENCY", 16)),
        json_schema=env.get("ENVACE_JUDGE_JSON_SCHEMA", "1") not in ("0", "false", "False"),
        reason_max_chars=int(env["ENVACE_JUDGE_REASON_MAX_CHARS"]) if env.get("ENVACE_JUDGE_REASON_MAX_CHARS")
        else None,
        prompt_name=reward_rules_from_env(env).judge_prompt,
    )


def parse_verdict(text: str | None) -> bool | None:
    """``True`` / ``False`` from a strict JSON verdict, ``None`` if malformed. Never raises."""
    if not isinstance(text, str):
        return None
    body = strip_think(text)
    if body is None:  # unbalanced think tags
        return None
    try:
        value = json.loads(body.strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("passed"), bool):
        return None
    return value["passed"]


def _snippets(evidence: Any) -> list[Any]:
    """CM2's ``evidence[].snippet`` (a plain string or list of strings is taken as the snippets)."""
    if not evidence:
        return []
    if isinstance(evidence, str):
        return [evidence]
    if isinstance(evidence, dict):
        evidence = [evidence]
    return [e.get("snippet", "") if isinstance(e, dict) else e for e in evidence]


class ChecklistJudge:
    """Judge client over an OpenAI-compatible endpoint (see the module docstring).

    Args:
        config: :class:`JudgeConfig`.
        client: an ``openai.OpenAI``-like client (default: built from ``config``; the SDK's own retries
            are disabled so that retries are counted here).
        sleep: the backoff sleep function (tests pass a no-op).
    """

    def __init__(self, config: JudgeConfig, client: Any = None, sleep: Callable[[float], None] = time.sleep):
        self.config = config
        self.prompt = load_prompt(config.prompt_name, required=("system", "user"))
        if client is None:
            client = openai_client(config.base_url, config.api_key, config.timeout_s, max_retries=0)
        self.client = client
        self.sleep = sleep
        self.metrics = JudgeMetrics()
        self._cache: dict[str, bool] = {}
        self._failed: set[str] = set()  # failed verdicts kept for one reuse (remember_failure)
        self._cache_lock = threading.Lock()
        if config.cache_path and Path(config.cache_path).is_file():
            for line in Path(config.cache_path).read_text(encoding="utf-8").splitlines():
                if line.strip():
                    entry = json.loads(line)
                    self._cache[entry["key"]] = bool(entry["passed"])

    def messages(self, history: list[dict[str, Any]], step: list[dict[str, Any]], step_index: int,
                 item: dict[str, Any]) -> list[dict[str, str]]:
        """The judge chat for one (step, item): ``history`` is everything before the step (system prompt,
        earlier turns, the current user message, the turn's earlier steps), ``step`` the assistant message
        and its tool results. v1 renders ``history`` whole; v2 splits it at the current turn's user
        message into ``previous`` and ``turn_before_step`` (as the authors' judge does); v3 (its
        ``step_view: reasoning``) renders every message with :func:`judge_transcript`."""
        failure = item.get("failure_examples") or []
        users = [i for i, m in enumerate(history) if m.get("role") == "user"]
        cut = users[-1] if users else len(history)

        def render(messages: list[dict[str, Any]], empty: str = "(empty)") -> str:
            if self.prompt.get("step_view") == "reasoning":  # v3: the authors' view of each step
                return judge_transcript(messages, empty=empty)
            return transcript(messages, call_prefix="tool call: ", empty=empty)

        user = self.prompt["user"].format(
            history=render(history),
            previous=render(history[:cut]),
            turn_before_step=render(history[cut:]),
            step_index=step_index,
            step=render(step, empty=""),
            question=item["question"],
            focus=item.get("focus", item.get("focus_on", "")),
            focus_on=item.get("focus_on", item.get("focus", "")),
            pass_condition=item.get("pass_condition", ""),
            failure_examples=failure if isinstance(failure, str) else json.dumps(failure, ensure_ascii=False),
            evidence=item.get("evidence", ""),
            reference_snippets=json.dumps(_snippets(item.get("evidence")), ensure_ascii=False),
        )
        system = self.prompt["system"].format()
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def _key(self, messages: list[dict[str, str]]) -> str:
        blob = json.dumps([self.prompt["version"], self.config.model, messages], sort_keys=True,
                          ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def verdict(self, messages: list[dict[str, str]], remember_failure: bool = False) -> bool | None:
        """One verdict (cached); ``None`` after ``max_retries`` failed retries.

        ``remember_failure``: a final failure is remembered for one later request of the same chat, which
        gets ``None`` without new requests (counted as a cache hit, not as another failure): the
        in-episode check (:func:`turn_passes_required`) hands its failures to the episode reward.
        """
        import openai

        key = self._key(messages)
        with self._cache_lock:
            if key in self._cache:
                self.metrics.add(cache_hits=1)
                return self._cache[key]
            if key in self._failed:
                self._failed.discard(key)
                self.metrics.add(cache_hits=1)
                return None
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                self.metrics.add(retries=1)
                self.sleep(self.config.backoff_s * 2 ** (attempt - 1))
            self.metrics.add(requests=1)
            try:
                reply = self.client.chat.completions.create(
                    model=self.config.model, messages=messages, temperature=self.config.temperature,
                    top_p=self.config.top_p, max_tokens=self.config.max_tokens,
                    extra_body=self.config.extra_body or None,
                    **({"response_format": verdict_format(self.config.reason_max_chars)}
                       if self.config.json_schema else {}),
                )
                text = reply.choices[0].message.content
            except openai.APITimeoutError:
                self.metrics.add(timeouts=1)
                continue
            except (openai.APIError, ValueError, KeyError, IndexError, AttributeError, TypeError):
                self.metrics.add(errors=1)
                continue
            passed = parse_verdict(text)
            if passed is None:
                self.metrics.add(malformed=1)
                continue
            self._store(key, passed)
            return passed
        self.metrics.add(failures=1)
        if remember_failure:
            with self._cache_lock:
                self._failed.add(key)
        return None

    def _store(self, key: str, passed: bool) -> None:
        with self._cache_lock:
            self._cache[key] = passed
            if self.config.cache_path:
                with open(self.config.cache_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"key": key, "passed": passed}) + "\n")

    def judge_many(self, requests: list[list[dict[str, str]]], remember_failure: bool = False
                   ) -> list[bool | None]:
        """Verdicts for many judge chats, ``max_concurrency`` at a time, in order."""
        if len(requests) <= 1 or self.config.max_concurrency <= 1:
            return [self.verdict(r, remember_failure) for r in requests]
        with ThreadPoolExecutor(self.config.max_concurrency) as pool:
            return list(pool.map(lambda r: self.verdict(r, remember_failure), requests))
