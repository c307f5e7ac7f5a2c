"""One tau2 conversation (:class:`Tau2Episode`): agent calls through tau2's ``Environment``, the user
simulator's turns, and tau2's own evaluators for the score (see :mod:`envace.bench.tau2`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from envace.bench.tau2.data import (
    GREETING,
    MAX_ERRORS,
    MAX_USER_TOOL_ROUNDS,
    _domain_info,
    _user_system_prompt,
    make_environment,
)
from envace.bench.tau2.user import UserModel
from envace.core.environment import EpisodeError, Score
from envace.core.tools import ToolCall

# --------------------------------------------------------------------------------------------------
# Episodes


class Ending(StrEnum):
    """How a tau2 conversation ended (subset of tau2's ``TerminationReason``)."""

    RUNNING = "running"
    USER_STOP = "user_stop"
    MAX_STEPS = "max_steps"


class Tau2Episode:
    """One tau2 conversation in one isolated environment (see the module docstring)."""

    def __init__(self, task: Any, domain: str, user_model: UserModel, seed: int,
                 user_info: Mapping[str, Any]) -> None:
        from tau2.data_model.message import AssistantMessage

        initial = task.initial_state
        if initial is not None and initial.message_history:
            raise EpisodeError(f"tau2 task {task.id}: initial message_history is not supported")
        self.task = task
        self.domain = domain
        self.user_model = user_model
        self.seed = seed
        self.user_info = dict(user_info)
        self.env = make_environment(domain)
        self.env.set_state(
            initialization_data=initial.initialization_data if initial is not None else None,
            initialization_actions=initial.initialization_actions if initial is not None else None,
            message_history=[],
        )
        _, _, _, self.user_tools = _domain_info(domain)
        self.trajectory: list[Any] = [AssistantMessage(role="assistant", content=GREETING)]
        self.user_chat: list[dict[str, Any]] = []
        self.ending = Ending.RUNNING
        self.num_errors = 0
        self._next_id = 0
        self._broken: str | None = None
        self._opening: str | None = None

    # -- helpers ------------------------------------------------------------------------------------

    def _call_id(self) -> str:
        self._next_id += 1
        return f"call_{self._next_id}"

    def _execute(self, call: ToolCall, requestor: str) -> tuple[Any, Any]:
        """Run one call through tau2's ``Environment.get_response``; returns tau2's ``(ToolCall,
        ToolMessage)``."""
        from tau2.data_model.message import ToolCall as Tau2ToolCall

        arguments = call.arguments if isinstance(call.arguments, dict) else {}
        tau2_call = Tau2ToolCall(id=self._call_id(), name=str(call.name), arguments=arguments,
                                 requestor=requestor)
        response = self.env.get_response(tau2_call)
        if response.error:
            self.num_errors += 1
        return tau2_call, response

    def _user_turns(self, agent_text: str) -> str | None:
        """Show ``agent_text`` to the user simulator; run its tool calls until it answers in text."""
        from tau2.data_model.message import UserMessage
        from tau2.user.base import OUT_OF_SCOPE, STOP, TRANSFER

        if not self.user_chat:
            self.user_chat.append({"role": "system", "content": _user_system_prompt(
                str(self.task.user_scenario), self.user_tools is not None)})
        self.user_chat.append({"role": "user", "content": agent_text})
        for _ in range(MAX_USER_TOOL_ROUNDS):
            turn = self.user_model.complete(self.user_chat, self.user_tools, self.seed)
            content = turn.content if turn.content and turn.content.strip() else None
            if not turn.tool_calls:
                if content is None:
                    raise EpisodeError("user simulator returned neither text nor tool calls")
                self.trajectory.append(UserMessage(role="user", content=content))
                self.user_chat.append({"role": "assistant", "content": content})
                if any(token in content for token in (STOP, TRANSFER, OUT_OF_SCOPE)):
                    self.ending = Ending.USER_STOP
                    return None
                return content
            executed = [self._execute(call, "user") for call in turn.tool_calls]
            self.trajectory.append(UserMessage(role="user", content=content,
                                               tool_calls=[c for c, _ in executed]))
            self.trajectory.extend(r for _, r in executed)
            self.user_chat.append({
                "role": "assistant", "content": content,
                "tool_calls": [{"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                               for c, _ in executed]})
            self.user_chat.extend({"role": "tool", "tool_call_id": c.id, "content": r.content}
                                  for c, r in executed)
        self.ending = Ending.MAX_STEPS
        return None

    def _require_opening(self) -> None:
        if self._opening is None:
            raise EpisodeError("tau2 episodes start with first_user_message() (the simulated user's "
                               "opening); the runner did not ask for it")

    # -- protocol -----------------------------------------------------------------------------------

    def first_user_message(self) -> str:
        """The user simulator's opening message (answer to tau2's agent greeting); the same text on
        repeated calls."""
        if self._opening is None:
            if len(self.trajectory) != 1:
                raise EpisodeError("first_user_message() must come before any other episode call")
            reply = self._user_turns(GREETING)
            if reply is None:
                raise EpisodeError("the user simulator ended the conversation before stating a request")
            self._opening = reply
        return self._opening

    def step(self, call: ToolCall) -> str:
        """Execute one agent call (never raises for bad calls: tau2 answers ``"Error: ..."``)."""
        from tau2.data_model.message import AssistantMessage

        self._require_opening()
        if self.ending is not Ending.RUNNING:
            return "Error: the conversation has ended."
        try:
            tau2_call, response = self._execute(call, "assistant")
        except Exception as exc:  # tau2 could not serialise a tool result: the state is unknown now
            self._broken = f"{type(exc).__name__}: {exc}"
            return f"Error: {exc}"
        self.trajectory.append(AssistantMessage(role="assistant", tool_calls=[tau2_call]))
        self.trajectory.append(response)
        return response.content if response.content is not None else ""

    def user_reply(self, assistant_text: str) -> str | None:
        """Record the agent's text and return the simulated user's answer (``None`` = over)."""
        from tau2.data_model.message import AssistantMessage

        self._require_opening()
        if self.ending is not Ending.RUNNING:
            return None
        text = assistant_text if assistant_text.strip() else "(no text)"
        self.trajectory.append(AssistantMessage(role="assistant", content=text))
        return self._user_turns(text)

    def score(self) -> Score:
        """Reward 1/0 from tau2's evaluators (see the module docstring)."""
        from tau2.data_model.tasks import RewardType
        from tau2.evaluator.evaluator_action import ActionEvaluator
        from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
        from tau2.evaluator.evaluator_env import EnvironmentEvaluator

        if self._broken is not None:
            raise EpisodeError(f"tau2 environment failed: {self._broken}")
        extra: dict[str, Any] = {"domain": self.domain, "tau2_task_id": self.task.id,
                                 "termination": str(self.ending), "num_tool_errors": self.num_errors,
                                 "num_messages": len(self.trajectory), **self.user_info}
        if self.ending is not Ending.USER_STOP:
            return Score(0.0, {}, {**extra, "note": "conversation did not end with a user stop"})
        if self.num_errors >= MAX_ERRORS:
            note = f"{self.num_errors} tool errors (tau2 limit {MAX_ERRORS})"
            return Score(0.0, {}, {**extra, "note": note})
        criteria = self.task.evaluation_criteria
        if criteria is None:
            return Score(1.0, {}, {**extra, "note": "no evaluation criteria"})
        basis = set(criteria.reward_basis)
        if RewardType.NL_ASSERTION in basis:
            raise EpisodeError(f"tau2 task {self.task.id}: NL-assertion scoring is not supported")
        parts: dict[str, float] = {}
        if basis & {RewardType.DB, RewardType.ENV_ASSERTION}:
            info = EnvironmentEvaluator.calculate_reward(
                environment_constructor=lambda solo_mode=False: make_environment(self.domain, solo_mode),
                task=self.task, full_trajectory=self.trajectory, solo_mode=False)
            parts["env"] = float(info.reward)
            if info.db_check is not None:
                extra["db_match"] = bool(info.db_check.db_match)
        if RewardType.ACTION in basis:
            parts["action"] = float(ActionEvaluator.calculate_reward(
                task=self.task, full_trajectory=self.trajectory).reward)
        if RewardType.COMMUNICATE in basis:
            parts["communicate"] = float(CommunicateEvaluator.calculate_reward(
                task=self.task, full_trajectory=self.trajectory).reward)
        reward = 1.0
        for value in parts.values():
            reward *= value
        extra["reward_basis"] = sorted(str(b.value) for b in basis)
        return Score(reward, parts, extra)
