"""verl's reward entry point for EnvACE episodes: the reward configured for the run, in verl's reward
workers.

verl entry point (:func:`compute_score`, verl's ``custom_reward_function`` signature): used by the verl
agent loop (``envace.train.verl_ext``), which passes the row's ``extra_info`` plus the ACT ``messages``.
Settings
come from the environment of the Ray workers: ``ENVACE_REWARD`` (``checklist`` default, or
``reference_match``), ``ENVACE_JUDGE_BASE_URL``, ``ENVACE_JUDGE_MODEL``, ``ENVACE_JUDGE_TEMPERATURE``,
``ENVACE_JUDGE_TOP_P``, ``ENVACE_JUDGE_FAILURE_POLICY``, ``ENVACE_JUDGE_MAX_RETRIES``,
``ENVACE_JUDGE_TIMEOUT_S``, ``ENVACE_JUDGE_MAX_TOKENS``, ``ENVACE_JUDGE_JSON_SCHEMA``,
``ENVACE_JUDGE_REASON_MAX_CHARS`` (all set by
``envace train`` from ``training.judge``), ``ENVACE_REWARD_RULES`` (:func:`reward_rules_env`, from
``training.reward_rules``); one judge client (and verdict cache) per process (per loaded copy of this
module: the agent loop takes :func:`dialogue_continues` from the module its reward function lives in).
``extra_info`` keys read:
``messages``, ``termination`` (the rollout's :class:`envace.core.rollout.Termination` value), ``rows`` (per
training row, in row order, its decoded response text, or a ``{"role", "text"}`` mapping: for the
per-row empty-response penalty), ``reference_calls``, ``checklists``. Requests
ask for at most 6000 tokens under a strict json_schema response format (:data:`VERDICT_FORMAT`), as the
authors' environment does. verl cannot drop a sample
from inside a reward function, so a ``drop_sample`` episode scores 0 there and is flagged ``dropped``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from envace.core.reward import (
    checklist_reward,
    reference_grounded_reward,
    reference_match_reward,
    reference_outcome_reward,
    reward_rules_from_env,
    row_penalties,
    turn_passes_required,
)
from envace.train.judge import ChecklistJudge, judge_config_from_env

__all__ = ["VERIFIABLE_REWARDS", "compute_score", "dialogue_continues"]

#: The verifiable rules that add an answer check to the call F1, by ``training.reward`` value.
_ANSWER_RULES = {"reference_outcome": reference_outcome_reward,
                 "reference_grounded": reference_grounded_reward}
#: ``training.reward`` values computed without a judge (envace.core.reward's verifiable rules).
VERIFIABLE_REWARDS = ("reference_match", *_ANSWER_RULES)

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
    """verl custom reward: ``{"score", "judge_failures", "judge_verdicts", "dropped"}`` for one episode, plus
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
    elif reward in _ANSWER_RULES:
        result = _ANSWER_RULES[reward](messages, _decoded(info.get("reference_calls")) or [],
                                       str(info.get("reference_answer") or ""), rules, termination)
    else:
        checklists = _decoded(ground_truth) or _decoded(info.get("checklists")) or []
        result = checklist_reward(messages, checklists, _process_judge(), rules, termination)
    out: dict[str, Any] = {"score": 0.0 if result.reward is None else float(result.reward),
                           "judge_failures": result.failures, "judge_verdicts": result.verdicts,
                           "dropped": result.reward is None}
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
    if os.environ.get("ENVACE_REWARD", "checklist") in VERIFIABLE_REWARDS:
        return True
    rules = reward_rules_from_env()
    if not rules.stop_on_required_failed:
        return True
    info = extra_info or {}
    checklists = _decoded(ground_truth) or _decoded(info.get("checklists")) or []
    return turn_passes_required(messages, checklists, user_turn, _process_judge(), rules)
