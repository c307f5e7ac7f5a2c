"""Trajectory rewards: the checklist reward over a judge's verdicts (paper) and verifiable reference-call
and outcome rewards (ours). The judge client is :class:`envace.train.judge.ChecklistJudge`; verl's reward
entry point is :mod:`envace.train.reward_fn`. This module is pure: no network, no environment variables
but :func:`reward_rules_from_env`.

Checklist reward (the paper's rule with the authors' details where it is silent: ``docs/deviations.md``),
:func:`checklist_reward`:

- The trajectory's chat is split into user turns (each user message opens a turn); checklist ``t`` of
  the example applies to user turn ``t``; user turns beyond the checklists are ignored.
- The judge gives a strict JSON verdict per (assistant step, checklist item); an item passes if it passes
  at any assistant step of its turn. Turn score = sum of the passed items' weights (weights sum to 1 per
  turn, see :mod:`envace.train.data`).

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
  ...}``, :func:`envace.core.rehearsal.error_observation`); a rehearsed *result* that merely holds an
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
  :func:`envace.core.tools.parse_tool_calls` (``parameters`` accepted as the arguments key).
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
  one reuse, :meth:`Judge.verdict`). ``reference_match`` has no judge: its dialogue is never
  stopped by this rule. ``False``: every user turn is replayed (ours before).
- ``judge_prompt`` (``"checklist_judge_v3"``): v3 shows the fields the authors' judge shows
  (``checklist_reward.py`` ``get_input_prompt_v2``): question, ``focus_on``, pass condition, failure
  examples, the items' ``evidence[].snippet`` s, the earlier turns and the current turn up to the judged
  step, each assistant step as its reasoning, visible reply and tool calls (``get_messages_str_v2``);
  ``checklist_judge_v2`` (ours before) shows a step's visible reply and calls only;
  ``checklist_judge_v1`` showed ``focus`` and the whole ``evidence``.

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

Verifiable grounded reward (ours, :func:`reference_grounded_reward`, ``reward: reference_grounded``): the
same call F1 averaged with a grounding check instead — the last number of the first turn's final answer
equals the last number of the last tool observation before it (the answer restates what the environment,
real or rehearsed, returned). It needs no real environment: where the answer depends on state the
episode never shows (the ledger's balances), a rehearsal cannot return the reference's number and
``reference_outcome``'s answer check is almost never met in a rehearsed episode (measured: reward max 0.5
over 20 verl steps on the ledger), while this check rewards an ACT answer that copies its observation,
which is what a right answer in the real environment takes. A reference answer without a number leaves
the call F1 alone, as for ``reference_outcome``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from envace.core.rehearsal import MALFORMED_CODE, RehearsalError
from envace.core.tools import strip_think

__all__ = [
    "EMPTY_RESPONSE_REWARD",
    "RewardResult",
    "RewardRules",
    "Judge",
    "FINAL_ANSWER_TERMINATIONS",
    "REWARD_RULES_ENV",
    "reward_rules_from_env",
    "reward_rules_env",
    "is_error_tool_call",
    "last_turn_answered",
    "row_is_empty",
    "row_penalties",
    "split_turns",
    "turn_has_tool_failure",
    "is_empty_response",
    "checklist_reward",
    "turn_passes_required",
    "reference_match_reward",
    "reference_grounded_reward",
    "reference_outcome_reward",
]

EMPTY_RESPONSE_REWARD = -0.1  # authors' code


#: Termination reasons (``envace.core.rollout.Termination`` values) of an episode whose last user turn ended
# in
#: a final answer, the only turns the authors' environment judges. ``max_turns`` is such a reason too when
#: the cap was hit at the end of a user turn (the chat then ends with an assistant message without tool
#: calls), see :func:`last_turn_answered`.
FINAL_ANSWER_TERMINATIONS: frozenset[str] = frozenset({"final_answer", "dialogue_stopped"})
#: The environment variable that carries ``training.reward_rules`` (JSON) into verl's reward workers.
REWARD_RULES_ENV = "ENVACE_REWARD_RULES"
#: ``focus_on`` values of items scored False without a judge call at a step followed by an error tool
#: call (authors' interaction.py).
TOOL_FOCUS: frozenset[str] = frozenset({"assistant.tool_calls", "tool.content"})
#: The error codes of our observation protocol (``envace.core.rehearsal.error_observation``): the analogue of
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
    judge_prompt: str = "checklist_judge_v3"
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
        """The rules of this harness before it took the authors' (every switch at its old value)."""
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
    the environment of verl's reward workers (called from ``envace.train.verl_ext.launch``)."""
    rules = RewardRules.from_mapping(cfg["training"].get("reward_rules") or {})
    return {REWARD_RULES_ENV: json.dumps(asdict(rules), sort_keys=True)}

class Judge(Protocol):
    """What the checklist rules ask of a judge (:class:`envace.train.judge.ChecklistJudge`; tests pass
    scripted ones): ``config.failure_policy`` (``"fail"``, ``"skip_item"`` or ``"drop_sample"``),
    ``metrics.add(**counts)``, the judge chat for one (turn, step, item), and verdicts for many chats
    (``True``/``False``, ``None`` for a failure after retries)."""

    config: Any
    metrics: Any

    def messages(self, prior: list[dict[str, Any]], step: list[dict[str, Any]], step_index: int,
                 item: dict[str, Any]) -> list[dict[str, str]]: ...

    def judge_many(self, requests: list[list[dict[str, str]]], remember_failure: bool = False
                   ) -> list[bool | None]: ...


@dataclass
class RewardResult:
    """``reward`` is ``None`` for a dropped sample; ``turn_scores`` per judged turn; ``failures`` counts
    judge failures in this episode, ``verdicts`` the judge verdicts it asked for (cached ones included;
    0 without a judge)."""

    reward: float | None
    turn_scores: list[float] = field(default_factory=list)
    failures: int = 0
    detail: dict[str, Any] = field(default_factory=dict)
    verdicts: int = 0


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
    """No assistant message with non-blank text (outside complete think blocks,
    :func:`envace.core.tools.strip_think`;
    a message with unbalanced think tags counts as text) or a tool call."""
    for m in messages:
        if m.get("role") != "assistant":
            continue
        content = str(m.get("content") or "")
        text = strip_think(content)
        if (content if text is None else text).strip() or m.get("tool_calls"):
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
                   judge: Judge, rules: RewardRules
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
                         user_turn: int, judge: Judge, rules: RewardRules | None = None) -> bool:
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
                     judge: Judge, rules: RewardRules | None = None,
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
        return RewardResult(None, failures=failures, detail={**detail, "dropped": "judge_failure"},
                            verdicts=len(requests))
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
        return RewardResult(None, failures=failures, detail={**detail, "dropped": "no_judged_turn"},
                            verdicts=len(requests))
    return RewardResult(sum(scores) / denominator, scores, failures, detail, verdicts=len(requests))


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


def _first_turn_last(messages: list[dict[str, Any]], role: str) -> str:
    """Content of the last message of ``role`` in the first user turn ("" if none); for ``assistant``
    only messages that call no tool (the final answer)."""
    turns = split_turns(messages)
    found = [str(m.get("content") or "") for m in (turns[0][1] if turns else [])
             if m.get("role") == role and not m.get("tool_calls")]
    return found[-1] if found else ""


def _last_number(text: str) -> float | None:
    numbers = _NUMBER.findall(text)
    return float(numbers[-1]) if numbers else None


def _calls_and_answer(messages: list[dict[str, Any]], reference_calls: list[dict[str, Any]],
                      reference_answer: str, rules: RewardRules | None, termination: str | None,
                      target: float | None, key: str) -> RewardResult:
    """:func:`reference_match_reward`'s call F1 averaged with "the first turn's answer's last number is
    ``target``" (``detail[key]``); the F1 alone when the reference answer holds no number, the episode was
    empty or the turn unjudged."""
    calls = reference_match_reward(messages, reference_calls, rules, termination)
    if (_last_number(reference_answer or "") is None or calls.detail.get("empty")
            or "unjudged_turn" in calls.detail):
        return calls
    given = _last_number(_first_turn_last(messages, "assistant"))
    ok = given is not None and target is not None and given == target
    return RewardResult(0.5 * float(calls.reward or 0.0) + 0.5 * ok, detail={**calls.detail, key: ok})


def reference_outcome_reward(messages: list[dict[str, Any]], reference_calls: list[dict[str, Any]],
                             reference_answer: str, rules: RewardRules | None = None,
                             termination: str | None = None) -> RewardResult:
    """The verifiable outcome reward (see the module docstring): :func:`reference_match_reward`'s call F1,
    averaged with the answer check when the reference answer holds a number."""
    return _calls_and_answer(messages, reference_calls, reference_answer, rules, termination,
                             _last_number(reference_answer or ""), "answer_ok")


def reference_grounded_reward(messages: list[dict[str, Any]], reference_calls: list[dict[str, Any]],
                              reference_answer: str, rules: RewardRules | None = None,
                              termination: str | None = None) -> RewardResult:
    """The verifiable grounded reward (see the module docstring): :func:`reference_match_reward`'s call
    F1, averaged with the check that the first turn's answer restates the last observation's last number
    (when the reference answer holds a number)."""
    return _calls_and_answer(messages, reference_calls, reference_answer, rules, termination,
                             _last_number(_first_turn_last(messages, "tool")), "answer_grounded")
