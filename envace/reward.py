"""Trajectory rewards: the checklist LLM judge (paper) and a verifiable reference-call match (ours).

Checklist reward (the authors' rule, as described in ``PAPER.md``), :func:`checklist_reward`:

- The trajectory's chat is split into user turns (each user message opens a turn); checklist ``t`` of
  the example applies to user turn ``t``. Training episodes start from the first user turn, so usually
  only turn 0 is present; turns without a checklist, and checklists for turns the episode never reached,
  are ignored (ours).
- The judge gives a strict JSON verdict per (assistant step, checklist item); an item passes if it passes
  at any assistant step of its turn. Turn score = sum of the passed items' weights (weights sum to 1 per
  turn, see :mod:`envace.data`), and 0 if a tool failed in that turn (a tool message whose content is a
  JSON object with an ``"error"`` key, i.e. a rehearsal / environment error observation).
- Episode reward = mean of the turn scores, in [0, 1]; an empty response (no assistant step with text or
  a tool call) gets -0.1 without asking the judge.

Judge client (:class:`ChecklistJudge`): an OpenAI-compatible chat endpoint (vLLM serving Qwen3-30B-A3B in
the paper config; temperature 0.6 / top_p 0.8 per the authors' script), prompt
``envace/prompts/checklist_judge_v1.yaml`` (ours). The reply must be a JSON object with a boolean
``"passed"`` (a leading ``<think>...</think>`` block and surrounding whitespace are allowed, nothing else).
A malformed reply, a timeout, a connection or HTTP error is retried with exponential backoff up to
``max_retries`` times; after that the verdict is a *failure*, handled by ``failure_policy``:

- ``"fail"``: the item counts as not passed at that step (default);
- ``"skip_item"``: the item is removed from its turn and the remaining weights are rescaled to sum to 1
  (a turn left with no item is left out of the mean; an episode left with no turn is dropped);
- ``"drop_sample"``: the episode gets no reward (``None``); the trainer drops its rows.

Verdicts are cached in memory (optionally persisted as JSONL) under the sha256 of (prompt version,
judge model, rendered messages), so identical steps are judged once. Every call, cache hit, retry,
malformed reply, timeout and final failure is counted in :class:`JudgeMetrics`.

verl entry point (:func:`compute_score`, verl's ``custom_reward_function`` signature): used by the verl
agent loop (``envace.verl_ext``), which passes the row's ``extra_info`` plus the ACT ``messages``. Settings
come from the environment of the Ray workers: ``ENVACE_REWARD`` (``checklist`` default, or
``reference_match``), ``ENVACE_JUDGE_BASE_URL``, ``ENVACE_JUDGE_MODEL``, ``ENVACE_JUDGE_TEMPERATURE``,
``ENVACE_JUDGE_TOP_P``, ``ENVACE_JUDGE_FAILURE_POLICY``, ``ENVACE_JUDGE_MAX_RETRIES``,
``ENVACE_JUDGE_TIMEOUT_S``, ``ENVACE_JUDGE_MAX_TOKENS``, ``ENVACE_JUDGE_JSON_SCHEMA`` (all set by
``envace train`` from ``training.judge``); one judge client (and verdict cache) per process. Requests
ask for at most 6000 tokens under a strict json_schema response format (:data:`VERDICT_FORMAT`), as the
authors' environment does. verl cannot drop a sample
from inside a reward function, so a ``drop_sample`` episode scores 0 there and is flagged ``dropped``.

Verifiable reward (ours, used at smoke scale and in tests, :func:`reference_match_reward`): the F1 between
the episode's tool calls in the first user turn and the example's reference calls, where a call with the
same name and arguments counts 1 and one with the same name only counts 0.5 (greedy one-to-one matching
in order); with no reference calls, 1 if the episode answered without calling a tool, else 0. An empty
response gets -0.1.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from envace.prompts import load_prompt

__all__ = [
    "EMPTY_RESPONSE_REWARD",
    "FailurePolicy",
    "JudgeConfig",
    "JudgeMetrics",
    "ChecklistJudge",
    "RewardResult",
    "parse_verdict",
    "split_turns",
    "turn_has_tool_failure",
    "is_empty_response",
    "checklist_reward",
    "reference_match_reward",
    "compute_score",
]

EMPTY_RESPONSE_REWARD = -0.1  # authors' code
FailurePolicy = Literal["fail", "skip_item", "drop_sample"]
FAILURE_POLICIES: tuple[str, ...] = ("fail", "skip_item", "drop_sample")

_THINK_RE = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)


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
    max_retries: int = 3  # ours
    timeout_s: float = 120.0  # ours
    backoff_s: float = 1.0  # ours; doubles per retry
    failure_policy: FailurePolicy = "fail"  # ours
    max_concurrency: int = 16  # ours
    prompt_name: str = "checklist_judge_v1"
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


def judge_config_from_env(env: Any) -> JudgeConfig:
    """The judge settings of a verl reward worker: ``ENVACE_JUDGE_*`` (set by
    :func:`envace.verl_ext.launch.judge_env` from ``training.judge``)."""
    return JudgeConfig(
        base_url=env["ENVACE_JUDGE_BASE_URL"], model=env["ENVACE_JUDGE_MODEL"],
        temperature=float(env.get("ENVACE_JUDGE_TEMPERATURE", 0.6)),
        top_p=float(env.get("ENVACE_JUDGE_TOP_P", 0.8)),
        failure_policy=env.get("ENVACE_JUDGE_FAILURE_POLICY", "fail"),
        max_retries=int(env.get("ENVACE_JUDGE_MAX_RETRIES", 3)),
        timeout_s=float(env.get("ENVACE_JUDGE_TIMEOUT_S", 120)),
        max_tokens=int(env.get("ENVACE_JUDGE_MAX_TOKENS", 6000)),
        json_schema=env.get("ENVACE_JUDGE_JSON_SCHEMA", "1") not in ("0", "false", "False"),
    )


def parse_verdict(text: str | None) -> bool | None:
    """``True`` / ``False`` from a strict JSON verdict, ``None`` if malformed. Never raises."""
    if not isinstance(text, str):
        return None
    body = _THINK_RE.sub("", text, count=1).strip()
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("passed"), bool):
        return None
    return value["passed"]


def _render_message(message: dict[str, Any]) -> str:
    lines = [f"[{message.get('role', '?')}]"]
    if message.get("content"):
        lines.append(str(message["content"]))
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function", tc)
        lines.append("tool call: " + json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")},
                                                ensure_ascii=False))
    return "\n".join(lines)


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
            import openai

            client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key,
                                   timeout=config.timeout_s, max_retries=0)
        self.client = client
        self.sleep = sleep
        self.metrics = JudgeMetrics()
        self._cache: dict[str, bool] = {}
        self._cache_lock = threading.Lock()
        if config.cache_path and Path(config.cache_path).is_file():
            for line in Path(config.cache_path).read_text(encoding="utf-8").splitlines():
                if line.strip():
                    entry = json.loads(line)
                    self._cache[entry["key"]] = bool(entry["passed"])

    def messages(self, history: list[dict[str, Any]], step: list[dict[str, Any]], step_index: int,
                 item: dict[str, Any]) -> list[dict[str, str]]:
        """The judge chat for one (step, item): ``step`` is the assistant message and its tool results."""
        failure = item.get("failure_examples") or []
        user = self.prompt["user"].format(
            history="\n\n".join(_render_message(m) for m in history) or "(empty)",
            step_index=step_index,
            step="\n\n".join(_render_message(m) for m in step),
            question=item["question"],
            focus=item.get("focus", ""),
            pass_condition=item.get("pass_condition", ""),
            failure_examples=failure if isinstance(failure, str) else json.dumps(failure, ensure_ascii=False),
            evidence=item.get("evidence", ""),
        )
        system = self.prompt["system"].format()
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def _key(self, messages: list[dict[str, str]]) -> str:
        blob = json.dumps([self.prompt["version"], self.config.model, messages], sort_keys=True,
                          ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def verdict(self, messages: list[dict[str, str]]) -> bool | None:
        """One verdict (cached); ``None`` after ``max_retries`` failed retries."""
        import openai

        key = self._key(messages)
        with self._cache_lock:
            if key in self._cache:
                self.metrics.add(cache_hits=1)
                return self._cache[key]
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
                    **({"response_format": VERDICT_FORMAT} if self.config.json_schema else {}),
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
        return None

    def _store(self, key: str, passed: bool) -> None:
        with self._cache_lock:
            self._cache[key] = passed
            if self.config.cache_path:
                with open(self.config.cache_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"key": key, "passed": passed}) + "\n")

    def judge_many(self, requests: list[list[dict[str, str]]]) -> list[bool | None]:
        """Verdicts for many judge chats, ``max_concurrency`` at a time, in order."""
        if len(requests) <= 1 or self.config.max_concurrency <= 1:
            return [self.verdict(r) for r in requests]
        with ThreadPoolExecutor(self.config.max_concurrency) as pool:
            return list(pool.map(self.verdict, requests))


@dataclass
class RewardResult:
    """``reward`` is ``None`` for a dropped sample; ``turn_scores`` per judged turn; ``failures`` counts
    judge failures in this episode."""

    reward: float | None
    turn_scores: list[float] = field(default_factory=list)
    failures: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


def split_turns(messages: list[dict[str, Any]]) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Per user turn: ``(history before the turn's assistant steps, the turn's later messages)``.

    Messages before the first user message (the system prompt) belong to the history of turn 0.
    """
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    turns = []
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(messages)
        turns.append((messages[: start + 1], messages[start + 1: end]))
    return turns


def _steps(body: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Group a turn's messages into assistant steps (an assistant message and the tool messages after it)."""
    steps: list[list[dict[str, Any]]] = []
    for m in body:
        if m.get("role") == "assistant":
            steps.append([m])
        elif steps:
            steps[-1].append(m)
    return steps


def turn_has_tool_failure(body: list[dict[str, Any]]) -> bool:
    """Whether any tool message in the turn is an error observation (JSON object with ``"error"``)."""
    for m in body:
        if m.get("role") != "tool":
            continue
        try:
            value = json.loads(m.get("content") or "")
        except (ValueError, TypeError):
            continue
        if isinstance(value, dict) and "error" in value:
            return True
    return False


def is_empty_response(messages: list[dict[str, Any]]) -> bool:
    """No assistant message with non-blank text (outside a think block) or a tool call."""
    for m in messages:
        if m.get("role") != "assistant":
            continue
        text = _THINK_RE.sub("", str(m.get("content") or ""), count=1)
        if text.strip() or m.get("tool_calls"):
            return False
    return True


def checklist_reward(messages: list[dict[str, Any]], checklists: list[list[dict[str, Any]]],
                     judge: ChecklistJudge) -> RewardResult:
    """The checklist reward of one episode (see the module docstring)."""
    if is_empty_response(messages):
        return RewardResult(EMPTY_RESPONSE_REWARD, detail={"empty": True})
    policy = judge.config.failure_policy
    turns = split_turns(messages)[: len(checklists)]
    plan: list[tuple[int, int, int]] = []  # (turn, step, item)
    requests = []
    for t, (history, body) in enumerate(turns):
        steps = _steps(body)
        for s, step in enumerate(steps):
            prior = history + [m for earlier in steps[:s] for m in earlier]
            for j, item in enumerate(checklists[t]):
                plan.append((t, s, j))
                requests.append(judge.messages(prior, step, s + 1, item))
    verdicts = judge.judge_many(requests)
    failures = sum(v is None for v in verdicts)
    if failures and policy == "drop_sample":
        judge.metrics.add(dropped_samples=1)
        return RewardResult(None, failures=failures, detail={"dropped": "judge_failure"})
    passed: dict[tuple[int, int], bool] = {}
    failed_items: set[tuple[int, int]] = set()
    for (t, _s, j), v in zip(plan, verdicts, strict=True):
        if v is None:
            failed_items.add((t, j))
        passed[(t, j)] = passed.get((t, j), False) or bool(v)
    scores = []
    for t, (_history, body) in enumerate(turns):
        items = list(enumerate(checklists[t]))
        if policy == "skip_item":
            # an item whose every verdict failed is skipped; one that passed somewhere still counts
            skipped = [j for j, _ in items if (t, j) in failed_items and not passed.get((t, j))]
            judge.metrics.add(skipped_items=len(skipped))
            items = [(j, it) for j, it in items if j not in skipped]
            if not items:
                continue
        total = sum(it["weight"] for _, it in items)
        if turn_has_tool_failure(body) or total <= 0:
            scores.append(0.0)
            continue
        scores.append(sum(it["weight"] for j, it in items if passed.get((t, j))) / total)
    if not scores:
        judge.metrics.add(dropped_samples=1)
        return RewardResult(None, failures=failures, detail={"dropped": "no_judged_turn"})
    return RewardResult(sum(scores) / len(scores), scores, failures)


def _first_turn_calls(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    turns = split_turns(messages)
    body = turns[0][1] if turns else []
    calls = []
    for m in body:
        if m.get("role") == "assistant":
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function", tc)
                calls.append((str(fn.get("name")), json.dumps(fn.get("arguments"), sort_keys=True)))
    return calls


def reference_match_reward(messages: list[dict[str, Any]],
                           reference_calls: list[dict[str, Any]]) -> RewardResult:
    """The verifiable reference-call reward (see the module docstring)."""
    if is_empty_response(messages):
        return RewardResult(EMPTY_RESPONSE_REWARD, detail={"empty": True})
    predicted = _first_turn_calls(messages)
    reference = [(str(c["name"]), json.dumps(c.get("arguments", {}), sort_keys=True))
                 for c in reference_calls]
    if not reference:
        return RewardResult(1.0 if not predicted else 0.0)
    unused = list(predicted)
    credit = 0.0
    for name, args in reference:
        if (name, args) in unused:
            unused.remove((name, args))
            credit += 1.0
            continue
        same_name = next((p for p in unused if p[0] == name), None)
        if same_name is not None:
            unused.remove(same_name)
            credit += 0.5
    if not predicted or credit == 0:
        return RewardResult(0.0, detail={"predicted": len(predicted)})
    precision, recall = credit / len(predicted), credit / len(reference)
    return RewardResult(2 * precision * recall / (precision + recall), detail={"predicted": len(predicted)})


_PROCESS_JUDGE: ChecklistJudge | None = None


def _decoded(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value.tolist() if hasattr(value, "tolist") else value


def _process_judge() -> ChecklistJudge:
    global _PROCESS_JUDGE
    if _PROCESS_JUDGE is None:
        env = os.environ
        if not env.get("ENVACE_JUDGE_BASE_URL") or not env.get("ENVACE_JUDGE_MODEL"):
            raise RuntimeError("checklist reward needs ENVACE_JUDGE_BASE_URL and ENVACE_JUDGE_MODEL")
        _PROCESS_JUDGE = ChecklistJudge(judge_config_from_env(env))
    return _PROCESS_JUDGE


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None
                  ) -> dict[str, Any]:
    """verl custom reward: ``{"score", "judge_failures", "dropped"}`` for one episode.

    ``extra_info`` must hold ``messages`` (the ACT chat); ``ground_truth`` is the checklists (JSON or
    list), ``extra_info["reference_calls"]`` the reference calls for ``ENVACE_REWARD=reference_match``.
    """
    info = extra_info or {}
    messages = _decoded(info.get("messages")) or []
    if os.environ.get("ENVACE_REWARD", "checklist") == "reference_match":
        result = reference_match_reward(messages, _decoded(info.get("reference_calls")) or [])
    else:
        checklists = _decoded(ground_truth) or _decoded(info.get("checklists")) or []
        result = checklist_reward(messages, checklists, _process_judge())
    return {"score": 0.0 if result.reward is None else float(result.reward),
            "judge_failures": result.failures, "dropped": result.reward is None}
