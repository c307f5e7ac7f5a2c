"""Trajectory rewards: the checklist LLM judge (paper) and a verifiable reference-call match (ours).

Checklist reward (the authors' rule, as described in ``PAPER.md``), :func:`checklist_reward`:

- The trajectory's chat is split into user turns (each user message opens a turn); checklist ``t`` of
  the example applies to user turn ``t``; user turns beyond the checklists are ignored.
- The judge gives a strict JSON verdict per (assistant step, checklist item); an item passes if it passes
  at any assistant step of its turn. Turn score = sum of the passed items' weights (weights sum to 1 per
  turn, see :mod:`envace.data`).

Rules where the paper is silent follow the authors' code by default; each has a switch in
:class:`RewardRules` (config ``training.reward_rules``; in verl's reward workers the environment variable
``ENVACE_REWARD_RULES``, :func:`reward_rules_from_env`):

- ``judge_terminated`` (default ``False``, authors' ``envs.py`` ``ChecklistEnv.async_step``: a caller
  parse error, a simulator ``error_tool_call`` or a length/turn limit ends the episode with turn reward 0;
  only a turn that ends in a final answer reaches the judge): if the rollout's termination reason
  (``extra_info["termination"]``) says the last user turn present did not end in a final answer
  (:func:`last_turn_answered`), that turn scores 0 and is not judged; earlier, completed turns keep their
  scores. ``True``: judged like any other turn (ours before).
- ``zero_turn_on`` (``"error_tool_call"``, authors' ``envs.py``): a turn scores 0 if one of its tool
  messages is an error tool call (:func:`is_error_tool_call`: the authors' ``{"error_tool_call": ...}``
  payload or a tool message named ``error_tool_call``, or our protocol's error observation
  ``{"error": <INVALID_TOOL_CALL_FORMAT | TOOL_NOT_AVAILABLE | INVALID_PARAMETERS | REHEARSAL_FAILED>,
  ...}``, :func:`envace.rehearsal.error_observation`); a rehearsed *result* that merely holds an
  ``"error"`` field does not. ``"any_error"``: any JSON object with an ``"error"`` key (ours before).
- ``auto_false_on_error_tool_call`` (``True``, authors' ``interaction.py``
  ``generate_response_for_single_checklist``): at an assistant step followed by an error tool call, items
  whose ``focus_on`` is exactly ``"assistant.tool_calls"`` or ``"tool.content"`` are False without a
  judge call.
- ``turn_normaliser`` (``"checklist_turns"``, authors' ``reward_manager/checklist.py``
  ``ChecklistEpisodeRewardManager``: sum of turn rewards / (checklists x checklist turns)): episode
  reward = sum of turn scores / number of checklist turns; turns the episode never reached count 0.
  ``"reached_turns"``: the mean over the turns present (ours before).
- ``empty_response_penalty`` (``"per_row"``, authors' ``verl/trainer/ppo/ray_trainer.py``
  ``apply_invalid_action_penalty`` with ``invalid_action_penalty_coef: 0.1`` and
  ``agent_system/agent/agents/checklist/tool_caller_agent.py`` / ``tool_simulator_agent.py``
  ``is_action_valid``): the episode reward is computed as usual and every training row (one ACT
  generation or one REHEARSE reply) whose decoded text is blank gets -0.1 added to its reward
  (:func:`row_penalties`; ``compute_score`` returns them as ``row_penalties``). ``"episode"``: an episode
  without a non-empty assistant step gets -0.1 as its reward, without asking the judge (ours before).
- ``parameters_key`` (``True``, authors' ``tool_parser.py``): acts in the ACT parser,
  :func:`envace.tools.parse_tool_calls` (``parameters`` accepted as the arguments key).
- ``stop_on_required_failed`` (``True``, authors' ``interaction.py``
  ``ChecklistInteraction.generate_response`` / ``generate_response_for_single_checklist``, called by
  ``envs.py`` ``ChecklistEnv`` at the end of every user turn): the judge runs inside the episode, at the
  end of each user turn that a replayed user turn would follow (:func:`turn_passes_required`; verl:
  :func:`dialogue_continues`, the rollout's ``continue_dialogue`` hook). The dialogue stops there
  (``dialogue_stopped``: no later user turn is replayed; with ``checklist_turns`` the turns never
  reached score 0) if an item marked ``required_for_next_turn`` passed at no step of the turn, or if any
  judge verdict of the turn failed (after the retries; any item, required or not, whatever
  ``failure_policy``: the authors stop on an API failure or a malformed verdict). Items scored False
  without the judge (``auto_false_on_error_tool_call``) count as not passed. The verdicts land in the
  judge's cache, so the episode reward does not request them again (a failed verdict is remembered for
  one reuse, :meth:`ChecklistJudge.verdict`). ``reference_match`` has no judge: its dialogue is never
  stopped by this rule. ``False``: every user turn is replayed (ours before).
- ``judge_prompt`` (``"checklist_judge_v2"``): v2 shows the fields the authors' judge shows
  (``checklist_reward.py`` ``get_input_prompt_v2``): question, ``focus_on``, pass condition, failure
  examples, the items' ``evidence[].snippet`` s, the earlier turns and the current turn up to the judged
  step; ``checklist_judge_v1`` (ours before) showed ``focus`` and the whole ``evidence``.

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
judge model, rendered messages), so identical steps are judged once (the in-episode check of
``stop_on_required_failed`` and the episode reward share them). Every call, cache hit, retry,
malformed reply, timeout and final failure is counted in :class:`JudgeMetrics`.

verl entry point (:func:`compute_score`, verl's ``custom_reward_function`` signature): used by the verl
agent loop (``envace.verl_ext``), which passes the row's ``extra_info`` plus the ACT ``messages``. Settings
come from the environment of the Ray workers: ``ENVACE_REWARD`` (``checklist`` default, or
``reference_match``), ``ENVACE_JUDGE_BASE_URL``, ``ENVACE_JUDGE_MODEL``, ``ENVACE_JUDGE_TEMPERATURE``,
``ENVACE_JUDGE_TOP_P``, ``ENVACE_JUDGE_FAILURE_POLICY``, ``ENVACE_JUDGE_MAX_RETRIES``,
``ENVACE_JUDGE_TIMEOUT_S``, ``ENVACE_JUDGE_MAX_TOKENS``, ``ENVACE_JUDGE_JSON_SCHEMA``,
``ENVACE_JUDGE_REASON_MAX_CHARS`` (all set by
``envace train`` from ``training.judge``), ``ENVACE_REWARD_RULES`` (:func:`reward_rules_env`, from
``training.reward_rules``); one judge client (and verdict cache) per process (per loaded copy of this
module: the agent loop takes :func:`dialogue_continues` from the module its reward function lives in).
``extra_info`` keys read:
``messages``, ``termination`` (the rollout's :class:`envace.rollout.Termination` value), ``rows`` (per
training row, in row order, its decoded response text, or a ``{"role", "text"}`` mapping: for the
per-row empty-response penalty), ``reference_calls``, ``checklists``. Requests
ask for at most 6000 tokens under a strict json_schema response format (:data:`VERDICT_FORMAT`), as the
authors' environment does. verl cannot drop a sample
from inside a reward function, so a ``drop_sample`` episode scores 0 there and is flagged ``dropped``.

Verifiable reward (ours, used at smoke scale and in tests, :func:`reference_match_reward`): the F1 between
the episode's tool calls in the first user turn and the example's reference calls, where a call with the
same name and arguments counts 1 and one with the same name only counts 0.5 (greedy one-to-one matching
in order); with no reference calls, 1 if the episode answered without calling a tool, else 0. The
termination and empty-response rules apply as for the checklist reward: a first turn that did not end in
a final answer scores 0 (``judge_terminated=False``), and the -0.1 is per row (``per_row``) or replaces
the episode reward (``episode``).

Verifiable outcome reward (ours, :func:`reference_outcome_reward`, ``reward: reference_outcome``): the
call F1 above averaged with an answer check — the last number of the episode's first-turn final answer
equals the last number of the example's reference answer (``extra_info["reference_answer"]``). In a
rehearsed episode the observation the answer copies is the policy's own rehearsal, so the answer check
rewards a faithful REHEARSE reply as well as a right ACT call. A reference answer without a number leaves
the call F1 alone; the termination and empty-response rules are reference_match's.
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

from envace.openai_client import openai_client
from envace.prompts import load_prompt
from envace.rehearsal import MALFORMED_CODE, RehearsalError

__all__ = [
    "EMPTY_RESPONSE_REWARD",
    "FailurePolicy",
    "JudgeConfig",
    "JudgeMetrics",
    "ChecklistJudge",
    "RewardResult",
    "RewardRules",
    "FINAL_ANSWER_TERMINATIONS",
    "REWARD_RULES_ENV",
    "reward_rules_from_env",
    "reward_rules_env",
    "is_error_tool_call",
    "last_turn_answered",
    "row_is_empty",
    "row_penalties",
    "parse_verdict",
    "split_turns",
    "turn_has_tool_failure",
    "is_empty_response",
    "checklist_reward",
    "turn_passes_required",
    "reference_match_reward",
    "reference_outcome_reward",
    "compute_score",
    "dialogue_continues",
]

EMPTY_RESPONSE_REWARD = -0.1  # authors' code
FailurePolicy = Literal["fail", "skip_item", "drop_sample"]
FAILURE_POLICIES: tuple[str, ...] = ("fail", "skip_item", "drop_sample")

_THINK_RE = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)

#: Termination reasons (``envace.rollout.Termination`` values) of an episode whose last user turn ended in
#: a final answer, the only turns the authors' environment judges. ``max_turns`` is such a reason too when
#: the cap was hit at the end of a user turn (the chat then ends with an assistant message without tool
#: calls), see :func:`last_turn_answered`.
FINAL_ANSWER_TERMINATIONS: frozenset[str] = frozenset({"final_answer", "dialogue_stopped"})
#: The environment variable that carries ``training.reward_rules`` (JSON) into verl's reward workers.
REWARD_RULES_ENV = "ENVACE_REWARD_RULES"
#: ``focus_on`` values of items scored False without a judge call at a step followed by an error tool
#: call (authors' interaction.py).
TOOL_FOCUS: frozenset[str] = frozenset({"assistant.tool_calls", "tool.content"})
#: The error codes of our observation protocol (``envace.rehearsal.error_observation``): the analogue of
#: the authors' ``error_tool_call`` payload.
PROTOCOL_ERROR_CODES: frozenset[str] = frozenset({c.value for c in RehearsalError} | {MALFORMED_CODE})


@dataclass(frozen=True)
class RewardRules:
    """The reward rules where the paper is silent; defaults = the authors' code (module docstring).

    :meth:`ours` gives the rules this harness used before (``judge_terminated=True``,
    ``zero_turn_on="any_error"``, ``auto_false_on_error_tool_call=False``, ``parameters_key=False``,
    ``turn_normaliser="reached_turns"``, ``empty_response_penalty="episode"``, ``checklist_judge_v1``,
    ``stop_on_required_failed=False``).
    """

    judge_terminated: bool = False
    zero_turn_on: Literal["error_tool_call", "any_error"] = "error_tool_call"
    auto_false_on_error_tool_call: bool = True
    parameters_key: bool = True
    turn_normaliser: Literal["checklist_turns", "reached_turns"] = "checklist_turns"
    # per_row on the verl path: the agent loop marks blank rows, EnvaceTrainer subtracts the penalty
    empty_response_penalty: Literal["per_row", "episode"] = "per_row"
    judge_prompt: str = "checklist_judge_v2"
    stop_on_required_failed: bool = True  # authors: a failed required_for_next_turn item ends the dialogue

    def __post_init__(self) -> None:
        choices = {"zero_turn_on": ("error_tool_call", "any_error"),
                   "turn_normaliser": ("checklist_turns", "reached_turns"),
                   "empty_response_penalty": ("per_row", "episode")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"reward_rules.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("judge_terminated", "auto_false_on_error_tool_call", "parameters_key",
                     "stop_on_required_failed"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"reward_rules.{name} must be a boolean, got {getattr(self, name)!r}")

    @classmethod
    def ours(cls) -> RewardRules:
        """The rules of this harness before issue 12 (every switch at its old value)."""
        return cls(judge_terminated=True, zero_turn_on="any_error", auto_false_on_error_tool_call=False,
                   parameters_key=False, turn_normaliser="reached_turns", empty_response_penalty="episode",
                   judge_prompt="checklist_judge_v1", stop_on_required_failed=False)

    @classmethod
    def from_mapping(cls, values: Any) -> RewardRules:
        """From a ``training.reward_rules`` mapping (missing keys keep the defaults; unknown keys raise)."""
        values = dict(values or {})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown reward_rules keys {unknown}; known: {sorted(known)}")
        return cls(**values)


def reward_rules_from_env(env: Any = None) -> RewardRules:
    """The rules of a verl reward worker: ``ENVACE_REWARD_RULES`` (a JSON object of
    ``training.reward_rules``, set by :func:`reward_rules_env`); unset = the authors' defaults."""
    env = os.environ if env is None else env
    raw = env.get(REWARD_RULES_ENV)
    return RewardRules.from_mapping(json.loads(raw) if raw else {})


def reward_rules_env(cfg: Any) -> dict[str, str]:
    """``{"ENVACE_REWARD_RULES": <JSON>}`` from ``cfg["training"]["reward_rules"]`` (validated here), for
    the environment of verl's reward workers (called from ``envace.verl_ext.launch``)."""
    rules = RewardRules.from_mapping(cfg["training"].get("reward_rules") or {})
    return {REWARD_RULES_ENV: json.dumps(asdict(rules), sort_keys=True)}


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
    prompt_name: str = "checklist_judge_v2"  # RewardRules.judge_prompt; v1: ours before
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
    otherwise: it ran to the token cap in every verdict, measured 2026-12-01)."""
    if reason_max_chars is None:
        return VERDICT_FORMAT
    out = json.loads(json.dumps(VERDICT_FORMAT))
    out["json_schema"]["schema"]["properties"]["reason"]["maxLength"] = int(reason_max_chars)
    return out


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
        reason_max_chars=int(env["ENVACE_JUDGE_REASON_MAX_CHARS"]) if env.get("ENVACE_JUDGE_REASON_MAX_CHARS")
        else None,
        prompt_name=reward_rules_from_env(env).judge_prompt,
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


def _snippets(evidence: Any) -> list[Any]:
    """CM2's ``evidence[].snippet`` (a plain string or list of strings is taken as the snippets)."""
    if not evidence:
        return []
    if isinstance(evidence, str):
        return [evidence]
    if isinstance(evidence, dict):
        evidence = [evidence]
    return [e.get("snippet", "") if isinstance(e, dict) else e for e in evidence]


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
        message into ``previous`` and ``turn_before_step`` (as the authors' judge does)."""
        failure = item.get("failure_examples") or []
        users = [i for i, m in enumerate(history) if m.get("role") == "user"]
        cut = users[-1] if users else len(history)

        def render(messages: list[dict[str, Any]]) -> str:
            return "\n\n".join(_render_message(m) for m in messages) or "(empty)"

        user = self.prompt["user"].format(
            history=render(history),
            previous=render(history[:cut]),
            turn_before_step=render(history[cut:]),
            step_index=step_index,
            step="\n\n".join(_render_message(m) for m in step),
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


def is_error_tool_call(message: dict[str, Any]) -> bool:
    """Whether a tool message is an error tool call: named ``error_tool_call``, or JSON content holding the
    authors' ``"error_tool_call"`` key, or our protocol's error observation (an ``"error"`` whose value is
    one of :data:`PROTOCOL_ERROR_CODES`). A result with any other ``"error"`` value is not one."""
    if message.get("role") != "tool":
        return False
    if message.get("name") == "error_tool_call":
        return True
    try:
        value = json.loads(message.get("content") or "")
    except (ValueError, TypeError, RecursionError):
        return False
    if not isinstance(value, dict):
        return False
    return "error_tool_call" in value or (isinstance(value.get("error"), str)
                                          and value["error"] in PROTOCOL_ERROR_CODES)


def turn_has_tool_failure(body: list[dict[str, Any]], zero_turn_on: str = "any_error") -> bool:
    """Whether the turn has a failed tool message. ``"error_tool_call"``: :func:`is_error_tool_call`
    (authors); ``"any_error"``: a JSON object with an ``"error"`` key (ours before)."""
    if zero_turn_on == "error_tool_call":
        return any(is_error_tool_call(m) for m in body)
    for m in body:
        if m.get("role") != "tool":
            continue
        try:
            value = json.loads(m.get("content") or "")
        except (ValueError, TypeError, RecursionError):
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


def row_is_empty(text: str | None) -> bool:
    """A training row's decoded response (special tokens skipped) is blank: the authors'
    ``is_action_valid == 0`` (a think block counts as text there, and here)."""
    return not (text or "").strip()


def row_penalties(rows: list[Any], rules: RewardRules | None = None) -> list[float]:
    """Per training row (in row order), what to add to the episode reward: ``-0.1`` for a blank row under
    ``empty_response_penalty="per_row"`` (authors' ``apply_invalid_action_penalty``), else 0. A row is
    its decoded response text or a mapping with ``"text"``."""
    rules = rules or RewardRules()
    texts = [r.get("text") if isinstance(r, dict) else r for r in rows or []]
    if rules.empty_response_penalty != "per_row":
        return [0.0] * len(texts)
    return [EMPTY_RESPONSE_REWARD if row_is_empty(t) else 0.0 for t in texts]


def _focus_on(item: dict[str, Any]) -> Any:
    return item.get("focus_on", item.get("focus"))


def last_turn_answered(messages: list[dict[str, Any]], termination: str) -> bool:
    """Whether the rollout's last user turn ended in a final answer: the termination is one of
    :data:`FINAL_ANSWER_TERMINATIONS`, or ``max_turns`` hit right after a final answer (the chat ends with
    an assistant message without tool calls; a cap hit inside a turn ends with a tool message). A parse
    error, a rehearsal error or malformed reply, the context limit (also when it stops the dialogue
    after a final answer: the last turn present is then the new, unanswered user turn) are not."""
    if str(termination) in FINAL_ANSWER_TERMINATIONS:
        return True
    if str(termination) == "max_turns" and messages:
        last = messages[-1]
        return last.get("role") == "assistant" and not last.get("tool_calls")
    return False


def _terminated_turn(messages: list[dict[str, Any]], n_turns: int, termination: str | None,
                     rules: RewardRules) -> int | None:
    """Index of the user turn that the rollout ended without a final answer (the last turn present), if it
    must not be judged; ``None`` if the reason is unknown, the turn was answered, or ``judge_terminated``."""
    if rules.judge_terminated or termination is None or n_turns == 0:
        return None
    return None if last_turn_answered(messages, termination) else n_turns - 1


def _turn_requests(history: list[dict[str, Any]], body: list[dict[str, Any]], items: list[dict[str, Any]],
                   judge: ChecklistJudge, rules: RewardRules
                   ) -> tuple[list[tuple[int, int]], list[list[dict[str, str]]], set[int]]:
    """One user turn's judge work: ``(plan, requests, decided)`` with ``plan[i] = (step, item)`` judged by
    ``requests[i]``, and ``decided`` the items scored False without the judge at some step (tool-focused
    items after an error tool call). The same chats for :func:`checklist_reward` and
    :func:`turn_passes_required`, so their verdicts share the judge's cache."""
    plan: list[tuple[int, int]] = []
    requests = []
    decided: set[int] = set()
    steps = _steps(body)
    for s, step in enumerate(steps):
        prior = history + [m for earlier in steps[:s] for m in earlier]
        errored = rules.auto_false_on_error_tool_call and any(is_error_tool_call(m) for m in step[1:])
        for j, item in enumerate(items):
            if errored and _focus_on(item) in TOOL_FOCUS:
                decided.add(j)
                continue
            plan.append((s, j))
            requests.append(judge.messages(prior, step, s + 1, item))
    return plan, requests, decided


def turn_passes_required(messages: list[dict[str, Any]], checklists: list[list[dict[str, Any]]],
                         user_turn: int, judge: ChecklistJudge, rules: RewardRules | None = None) -> bool:
    """Whether the dialogue may go on after user turn ``user_turn`` (``stop_on_required_failed``, see the
    module docstring; the authors' ``ChecklistInteraction.generate_response``).

    Judges every (step, item) of that turn (the verdicts the episode reward will need; cached, failures
    remembered for one reuse) and returns ``False`` if a verdict failed or an item with a true
    ``required_for_next_turn`` passed at no step. ``True`` without a judge call when the rule is off, or
    the turn or its checklist does not exist.
    """
    rules = rules or RewardRules()
    turns = split_turns(messages)
    if not rules.stop_on_required_failed or user_turn >= min(len(turns), len(checklists)):
        return True
    history, body = turns[user_turn]
    items = checklists[user_turn]
    plan, requests, _decided = _turn_requests(history, body, items, judge, rules)
    verdicts = judge.judge_many(requests, remember_failure=True)
    if any(v is None for v in verdicts):
        return False
    passed = {j for (_s, j), v in zip(plan, verdicts, strict=True) if v}
    return all(j in passed for j, item in enumerate(items) if item.get("required_for_next_turn") is True)


def checklist_reward(messages: list[dict[str, Any]], checklists: list[list[dict[str, Any]]],
                     judge: ChecklistJudge, rules: RewardRules | None = None,
                     termination: str | None = None) -> RewardResult:
    """The checklist reward of one episode (see the module docstring).

    ``rules``: :class:`RewardRules` (default: the authors'); ``termination``: the rollout's termination
    reason (``None``: unknown, every turn is judged).
    """
    rules = rules or RewardRules()
    if rules.empty_response_penalty == "episode" and is_empty_response(messages):
        return RewardResult(EMPTY_RESPONSE_REWARD, detail={"empty": True})
    policy = judge.config.failure_policy
    all_turns = split_turns(messages)
    turns = all_turns[: len(checklists)]
    unjudged = _terminated_turn(messages, len(all_turns), termination, rules)
    plan: list[tuple[int, int, int]] = []  # (turn, step, item)
    requests = []
    decided: set[tuple[int, int]] = set()  # items with a verdict given without the judge (False)
    for t, (history, body) in enumerate(turns):
        if t == unjudged:
            continue
        turn_plan, turn_requests, turn_decided = _turn_requests(history, body, checklists[t], judge, rules)
        plan.extend((t, s, j) for s, j in turn_plan)
        requests.extend(turn_requests)
        decided.update((t, j) for j in turn_decided)
    verdicts = judge.judge_many(requests)
    failures = sum(v is None for v in verdicts)
    detail: dict[str, Any] = {"auto_false": len(decided)}
    if unjudged is not None and unjudged < len(turns):
        detail["unjudged_turn"] = unjudged
    if failures and policy == "drop_sample":
        judge.metrics.add(dropped_samples=1)
        return RewardResult(None, failures=failures, detail={**detail, "dropped": "judge_failure"})
    passed: dict[tuple[int, int], bool] = {}
    failed_items: set[tuple[int, int]] = set()
    for (t, _s, j), v in zip(plan, verdicts, strict=True):
        if v is None:
            failed_items.add((t, j))
        passed[(t, j)] = passed.get((t, j), False) or bool(v)
    scores = []
    skipped_turns = 0
    for t, (_history, body) in enumerate(turns):
        if t == unjudged:
            scores.append(0.0)
            continue
        items = list(enumerate(checklists[t]))
        if policy == "skip_item":
            # an item whose every verdict failed is skipped; one that passed somewhere (or was decided
            # without the judge) still counts
            skipped = [j for j, _ in items
                       if (t, j) in failed_items and not passed.get((t, j)) and (t, j) not in decided]
            judge.metrics.add(skipped_items=len(skipped))
            items = [(j, it) for j, it in items if j not in skipped]
            if not items:
                skipped_turns += 1
                continue
        total = sum(it["weight"] for _, it in items)
        if turn_has_tool_failure(body, rules.zero_turn_on) or total <= 0:
            scores.append(0.0)
            continue
        scores.append(sum(it["weight"] for j, it in items if passed.get((t, j))) / total)
    if rules.turn_normaliser == "checklist_turns":
        denominator = len(checklists) - skipped_turns  # turns never reached count 0
    else:
        denominator = len(scores)
    if denominator <= 0:
        judge.metrics.add(dropped_samples=1)
        return RewardResult(None, failures=failures, detail={**detail, "dropped": "no_judged_turn"})
    return RewardResult(sum(scores) / denominator, scores, failures, detail)


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


def reference_match_reward(messages: list[dict[str, Any]], reference_calls: list[dict[str, Any]],
                           rules: RewardRules | None = None, termination: str | None = None) -> RewardResult:
    """The verifiable reference-call reward (see the module docstring)."""
    rules = rules or RewardRules()
    if rules.empty_response_penalty == "episode" and is_empty_response(messages):
        return RewardResult(EMPTY_RESPONSE_REWARD, detail={"empty": True})
    if _terminated_turn(messages, len(split_turns(messages)), termination, rules) == 0:
        return RewardResult(0.0, detail={"unjudged_turn": 0})
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


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _first_turn_answer(messages: list[dict[str, Any]]) -> str:
    """Content of the last assistant message of the first user turn that calls no tool ("" if none)."""
    turns = split_turns(messages)
    answers = [str(m.get("content") or "") for m in (turns[0][1] if turns else [])
               if m.get("role") == "assistant" and not m.get("tool_calls")]
    return answers[-1] if answers else ""


def reference_outcome_reward(messages: list[dict[str, Any]], reference_calls: list[dict[str, Any]],
                             reference_answer: str, rules: RewardRules | None = None,
                             termination: str | None = None) -> RewardResult:
    """The verifiable outcome reward (see the module docstring): :func:`reference_match_reward`'s call F1,
    averaged with the answer check when the reference answer holds a number."""
    calls = reference_match_reward(messages, reference_calls, rules, termination)
    expected = _NUMBER.findall(reference_answer or "")
    if not expected or calls.detail.get("empty") or "unjudged_turn" in calls.detail:
        return calls
    given = _NUMBER.findall(_first_turn_answer(messages))
    answer_ok = bool(given) and float(given[-1]) == float(expected[-1])
    return RewardResult(0.5 * float(calls.reward or 0.0) + 0.5 * answer_ok,
                        detail={**calls.detail, "answer_ok": answer_ok})


_PROCESS_JUDGE: ChecklistJudge | None = None


def _decoded(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value.tolist() if hasattr(value, "tolist") else value


def _process_judge() -> ChecklistJudge:
    """The process's judge client; its prompt is ``ENVACE_REWARD_RULES``' ``judge_prompt``."""
    global _PROCESS_JUDGE
    if _PROCESS_JUDGE is None:
        env = os.environ
        if not env.get("ENVACE_JUDGE_BASE_URL") or not env.get("ENVACE_JUDGE_MODEL"):
            raise RuntimeError("checklist reward needs ENVACE_JUDGE_BASE_URL and ENVACE_JUDGE_MODEL")
        _PROCESS_JUDGE = ChecklistJudge(judge_config_from_env(env))
    return _PROCESS_JUDGE


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None
                  ) -> dict[str, Any]:
    """verl custom reward: ``{"score", "judge_failures", "dropped"}`` for one episode, plus
    ``"row_penalties"`` (a list, one per row, see :func:`row_penalties`) when ``extra_info["rows"]`` is
    given: row ``i``'s reward is ``score + row_penalties[i]``.

    ``extra_info`` must hold ``messages`` (the ACT chat) and should hold ``termination`` (the rollout's
    termination reason; without it every turn is judged); ``ground_truth`` is the checklists (JSON or
    list), ``extra_info["reference_calls"]`` the reference calls for ``ENVACE_REWARD=reference_match``.
    Rules: ``ENVACE_REWARD_RULES`` (:func:`reward_rules_from_env`).
    """
    info = extra_info or {}
    rules = reward_rules_from_env()
    messages = _decoded(info.get("messages")) or []
    termination = info.get("termination")
    termination = None if termination is None or termination == "" else str(termination)
    reward = os.environ.get("ENVACE_REWARD", "checklist")
    if reward == "reference_match":
        result = reference_match_reward(messages, _decoded(info.get("reference_calls")) or [], rules,
                                        termination)
    elif reward == "reference_outcome":
        result = reference_outcome_reward(messages, _decoded(info.get("reference_calls")) or [],
                                          str(info.get("reference_answer") or ""), rules, termination)
    else:
        checklists = _decoded(ground_truth) or _decoded(info.get("checklists")) or []
        result = checklist_reward(messages, checklists, _process_judge(), rules, termination)
    out: dict[str, Any] = {"score": 0.0 if result.reward is None else float(result.reward),
                           "judge_failures": result.failures, "dropped": result.reward is None}
    rows = _decoded(info.get("rows"))
    if rows is not None:
        out["row_penalties"] = row_penalties(list(rows), rules)
    return out


def dialogue_continues(messages: list[dict[str, Any]], user_turn: int, ground_truth: Any,
                       extra_info: dict[str, Any] | None) -> bool:
    """verl side of ``stop_on_required_failed``: whether user turn ``user_turn + 1`` is replayed after
    ``messages`` (the ACT chat ending with the final answer to user turn ``user_turn``). Blocking (judge
    HTTP calls): the agent loop calls it in a worker thread. ``True`` without a judge for
    ``ENVACE_REWARD=reference_match`` or with the rule off; else :func:`turn_passes_required` with this
    process's judge (whose cache :func:`compute_score` then reuses). Checklists as in
    :func:`compute_score`."""
    if os.environ.get("ENVACE_REWARD", "checklist") in ("reference_match", "reference_outcome"):
        return True
    rules = reward_rules_from_env()
    if not rules.stop_on_required_failed:
        return True
    info = extra_info or {}
    checklists = _decoded(ground_truth) or _decoded(info.get("checklists")) or []
    return turn_passes_required(messages, checklists, user_turn, _process_judge(), rules)
