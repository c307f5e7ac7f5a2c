"""The ACT/REHEARSE rollout loop (backend-agnostic, async).

Implemented: one trajectory ``tau = (x, a_1, o_1, ..., a_T, o_T)`` for one task.
- ACT: the policy generates the next turn from the ACT context; :func:`envace.core.tools.parse_tool_calls`
  reads it. A final answer (no calls) ends the episode; each call (several = parallel calls, answered in
  order) gets an observation from the responder of the chosen :class:`Mode`:
  ``rehearsal`` — the same policy in the REHEARSE role (EnvACE); ``external_simulator`` — another backend
  with the same rehearsal prompt (the standard-GRPO baseline; its generations are marked not
  trainable); ``real`` — an :class:`Environment`, which only ever receives a parsed name and arguments
  dict, never model text.
- Token bookkeeping: the ACT context is a :class:`envace.core.tools.ChatTokens` — model tokens appended as
  generated (never decoded and re-encoded), observations appended as chat-template deltas (tool
  messages + the next generation prompt). Each trajectory's REHEARSE chat is a separate, prefix-stable
  :class:`envace.core.rehearsal.RehearsalContext`; only new parts of any prompt are encoded.
- Termination (:class:`Termination`): final answer (to the last user turn); ACT parse error; rehearsal
  error code (``terminate_on_rehearsal_error``, default, as the authors: a simulator error ends the
  episode; it also covers errors answered by a harness precheck, as the authors' schema checks do) or
  malformed rehearsal (``terminate_on_rehearsal_malformed``, default); ``max_turns`` ACT turns (default
  30, counted over the whole dialogue); context limit; ``continue_dialogue`` said stop.
- Multi-turn replay (training; the authors' ``ChecklistEnv`` + ``ChecklistInteraction``): with
  ``user_turns`` (the reference dialogue's later user messages) and ``replay_user_turns`` (default), a
  final answer to user turn t is followed by user turn t+1, appended to the ACT context as a chat
  template delta (not trained, :attr:`TokenRole.OBSERVATION`), and ACT goes on. It stops when the user
  turns are exhausted (``FINAL_ANSWER``), or, as the authors, when ``max_turns`` ACT turns or
  ``max_user_turns`` user turns were reached at the end of a user turn (``MAX_TURNS``). The optional
  ``continue_dialogue(messages, user_turn)`` hook may stop it after a user turn (``DIALOGUE_STOPPED``;
  asked only when a next user turn would follow, after the caps). The authors stop when a checklist
  item marked ``required_for_next_turn`` failed or a judge call failed: a judge-in-the-loop rule this
  module leaves to its caller; the verl agent loop wires it to
  :func:`envace.train.reward_fn.dialogue_continues`.
  Evaluation never passes ``user_turns`` (its benchmarks have their own user simulators).
- Context limits, ``context_budget``:
  ``"per_generation"`` (the authors': ``ChecklistEnv._check_caller_length_or_terminate``, context +
  8k response < 20k): every ACT generation starts from a context of at most ``max_prompt_tokens`` tokens
  (else ``CONTEXT_LIMIT``) and may produce ``max_response_tokens`` tokens; a generation cut at that cap
  is parsed like any other (the authors parse whatever the caller wrote).
  ``"episode"`` (ours; the dataclass default, on which evaluation and test-time scaling rely): the
  initial ACT prompt must fit ``max_prompt_tokens``; everything after it (ACT tokens, observations,
  injected user turns) must fit ``max_response_tokens`` — each ACT generation's ``max_tokens`` is capped
  by what is left, and a turn that exhausts it ends the episode.
  A REHEARSE context may hold ``max_rehearse_context_tokens`` in both.
- Output: :class:`Trajectory` with the chat messages, the ordered :class:`Generation` list (one training
  row each, as in the authors' layout), the final ACT context ids with per-token :class:`TokenRole`.

Simplifications (ours): calls of one turn are answered sequentially; a terminating observation is
recorded in ``messages`` but not appended to the ACT context (nothing is generated after it); with
``on_act_parse_error="observe"`` (our option; the paper terminates) an unparsable ACT turn is answered
with ``INVALID_TOOL_CALL_FORMAT`` — by the rehearsing model, or by the harness in ``real`` mode or with a
precheck. A stop token other than the turn end (e.g. ``<|endoftext|>``) is left in the decoded text.
Turn cap, ``turn_cap``: ``"every_turn"`` (ours; the dataclass default, used by evaluation and
test-time scaling) ends the episode after ``max_turns`` ACT generations, inside a user turn too;
``"user_turn_end"`` (the authors': ``max_assistant_turns`` is checked only after a final answer, and the
episode is bounded by ``env.max_steps`` = 200 environment steps) lets ACT go on calling tools within a
user turn, checks ``max_turns`` only where a next user turn would start, and ends the episode
(``MAX_TURNS``) after ``max_env_steps`` ACT generations. Training sets it. A replayed user
turn and the final answer before it reach the REHEARSE chat: as its history if nothing was rehearsed
yet, else in the next REHEARSE user message (``rehearsal_v2``'s ``dialogue`` section; the authors
re-serialise the whole history into a fresh simulator chat for every call, we keep one growing chat
that holds the same dialogue). With ``prompt_name="rehearsal_v1"`` (ours before) only the first case.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum
from typing import Any, Literal, Protocol

import numpy as np

from envace.common.settings import EPISODE_DEFAULTS
from envace.core.rehearsal import (
    CallCandidate,
    OutcomeKind,
    Precheck,
    RehearsalContext,
    RehearsalOutcome,
    RehearsalPrompt,
    ToolRegistry,
    parse_rehearsal_output,
    precheck_call,
)
from envace.core.single_call import RESPONSE_FORMAT as SINGLE_CALL_FORMAT
from envace.core.single_call import failed_outcome, parse_single_call_reply, single_call_messages
from envace.core.tools import (
    ChatTemplateTokenizer,
    ChatTokens,
    ToolCall,
    assistant_message,
    parse_tool_calls,
    reasoning_text,
    render_chat,
    tool_message,
)

__all__ = [
    "BackendError",
    "GenerateBackend",
    "Environment",
    "Mode",
    "Termination",
    "TokenRole",
    "RolloutConfig",
    "Generation",
    "Trajectory",
    "run_rollout",
    "act_context_roles",
    "generation_roles",
]


class GenerateBackend(Protocol):
    """A token-in/token-out generator (vLLM server, verl server manager, local HF model, script)."""

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> tuple[list[int], list[float]]:
        """Return ``(token_ids, logprobs)`` of one sampled continuation (same length ``T``)."""
        ...


class BackendError(RuntimeError):
    """The model backend cannot generate (server died, unreachable, bad reply): the run must stop."""


class Environment(Protocol):
    """A real tool environment for ``Mode.REAL``: executes one parsed call, returns the observation."""

    def step(self, call: ToolCall) -> str: ...


class Mode(StrEnum):
    """Who answers tool calls."""

    REHEARSAL = "rehearsal"
    EXTERNAL_SIMULATOR = "external_simulator"
    REAL = "real"


class Termination(StrEnum):
    """Why a trajectory ended."""

    FINAL_ANSWER = "final_answer"
    ACT_PARSE_ERROR = "act_parse_error"
    REHEARSAL_ERROR = "rehearsal_error"
    REHEARSAL_MALFORMED = "rehearsal_malformed"
    MAX_TURNS = "max_turns"
    CONTEXT_LIMIT = "context_limit"
    DIALOGUE_STOPPED = "dialogue_stopped"


class TokenRole(IntEnum):
    """Per-token role in a context: prompt (not trained), ACT / REHEARSE output, observation (not
    trained; tool messages, replayed user turns and template markup appended between turns)."""

    PROMPT = 0
    ACT = 1
    REHEARSE = 2
    OBSERVATION = 3


@dataclass
class RolloutConfig:
    """Rollout settings. The episode rules default to the training run's defaults
    (:data:`envace.common.settings.EPISODE_DEFAULTS`, the schema's ``training.runs.<run>.episode``):
    the authors' code where it has one, else ours; an evaluation states its own
    (:func:`envace.core.settings.evaluation_rollout`, from ``evaluation.episode``)."""

    mode: Mode = Mode.REHEARSAL
    max_turns: int = 30  # paper: at most 30 turns
    max_prompt_tokens: int = 12288  # authors: 12k prompt
    max_response_tokens: int = 8192  # authors: 8k response
    max_rehearse_context_tokens: int = 20480  # ours: the same 20k total for a REHEARSE context
    act_sampling: dict[str, Any] = field(default_factory=lambda: {"temperature": 1.0, "max_tokens": 8192})
    rehearse_sampling: dict[str, Any] = field(
        default_factory=lambda: {"temperature": 1.0, "max_tokens": EPISODE_DEFAULTS["rehearse_max_tokens"]}
    )
    precheck: Precheck = "none"  # ours; "none" is faithful
    on_act_parse_error: Literal["terminate", "observe"] = "terminate"
    terminate_on_rehearsal_malformed: bool = EPISODE_DEFAULTS["terminate_on_rehearsal_malformed"]
    terminate_on_rehearsal_error: bool = EPISODE_DEFAULTS["terminate_on_rehearsal_error"]
    replay_user_turns: bool = EPISODE_DEFAULTS["replay_user_turns"]  # needs the task's user_turns
    max_user_turns: int = 30  # authors' script: max_user_turns=30
    context_budget: Literal["per_generation", "episode"] = EPISODE_DEFAULTS["context_budget"]
    turn_cap: Literal["every_turn", "user_turn_end"] = EPISODE_DEFAULTS["turn_cap"]
    max_env_steps: int = EPISODE_DEFAULTS["max_env_steps"]  # with turn_cap="user_turn_end"
    rehearse_truncation: Literal["left", "none"] = EPISODE_DEFAULTS["rehearse_truncation"]
    rehearse_think_switch: bool = EPISODE_DEFAULTS["rehearse_think_switch"]  # "/think" ends REHEARSE turns
    # external_simulator only: "rehearsal" = the rehearsal prompt in one growing chat (ours before);
    # "single_call" = the authors' caller-only simulator (envace.core.single_call), up to
    # simulator_attempts requests per call
    simulator_protocol: Literal["rehearsal", "single_call"] = "rehearsal"
    simulator_attempts: int = 5
    prompt_name: str = EPISODE_DEFAULTS["rehearsal_prompt"]
    parameters_key: bool = True  # authors' tool_parser: "parameters" accepted as the arguments key
    template_kwargs: dict[str, Any] = field(  # enable_thinking: False unless the episode rules turn it on
        default_factory=lambda: template_kwargs(EPISODE_DEFAULTS["enable_thinking"])
    )


def template_kwargs(enable_thinking: bool) -> dict[str, Any]:
    """Chat-template arguments for an ``enable_thinking`` rule: ``{}`` (the template's default: Qwen3
    thinks) or ``{"enable_thinking": False}``."""
    return {} if enable_thinking else {"enable_thinking": False}


@dataclass
class Generation:
    """One model output (one training row).

    ``context``/``prompt_len``: the context the output was generated from (it only grows, so its first
    ``prompt_len`` ids are the prompt). ``trainable`` is False for an external simulator's outputs.
    """

    role: Literal["act", "rehearse"]
    context: list[int] = field(repr=False)
    prompt_len: int
    response_ids: list[int]
    logprobs: list[float]
    turn: int
    trainable: bool = True
    user_turn: int = 0  # index of the user turn the generation answers (multi-turn replay)

    @property
    def prompt_ids(self) -> list[int]:
        """Prompt ids, shape ``(prompt_len,)``."""
        return self.context[: self.prompt_len]


@dataclass
class Trajectory:
    """One rollout.

    ``messages``: the ACT chat (initial messages, assistant turns with parsed ``tool_calls``, tool
    observations). ``generations``: ACT and REHEARSE outputs in order. ``act_ids``: the final ACT context,
    shape ``(L,)``; ``act_segments``: ``(role, length)`` runs covering ``act_ids``. ``encoded_tokens``:
    token ids produced by encoding text, per context kind (``"act"``, ``"rehearse"``).
    ``user_turns``: user turns the ACT chat holds (1 + the replayed ones). ``rehearsed``: each call a
    model answered (the policy's REHEARSE role or the external simulator; not prechecks, not a real
    environment), in order, with its parsed outcome (``call`` ``None``: an unparsable call).
    """

    messages: list[dict[str, Any]]
    generations: list[Generation]
    termination: Termination
    act_ids: list[int]
    act_segments: list[tuple[TokenRole, int]]
    num_turns: int
    final_answer: str | None = None
    encoded_tokens: dict[str, int] = field(default_factory=dict)
    user_turns: int = 1
    rehearsed: list[tuple[ToolCall | None, RehearsalOutcome]] = field(default_factory=list)


def _expand(segments: list[tuple[TokenRole, int]]) -> np.ndarray:
    roles = np.array([int(r) for r, _ in segments], dtype=np.int8)
    lengths = np.array([n for _, n in segments], dtype=np.int64)
    return np.repeat(roles, lengths)


def act_context_roles(trajectory: Trajectory) -> np.ndarray:
    """Per-token :class:`TokenRole` of ``trajectory.act_ids``, shape ``(L,)``, int8.

    For one-sequence-per-trajectory training the loss mask is ``roles == TokenRole.ACT``.
    """
    return _expand(trajectory.act_segments)


def generation_roles(generation: Generation) -> np.ndarray:
    """Per-token :class:`TokenRole` of one row (prompt + response), shape ``(prompt_len + T,)``, int8."""
    role = TokenRole.ACT if generation.role == "act" else TokenRole.REHEARSE
    return _expand([(TokenRole.PROMPT, generation.prompt_len), (role, len(generation.response_ids))])


def _with_reasoning(message: dict[str, Any], text: str) -> dict[str, Any]:
    """``message`` with the reasoning of the output it was parsed from (``envace_reasoning``, the first
    think block's text) where there is one: the parsed message keeps only the visible reply and the
    calls, and the judge's step view (checklist_judge_v3) shows the reasoning too. Chat templates ignore
    the key."""
    reasoning = reasoning_text(text)
    if reasoning is not None:
        message["envace_reasoning"] = reasoning
    return message


class _Run:
    """State of one rollout (internal)."""

    def __init__(
        self,
        policy: GenerateBackend,
        tokenizer: ChatTemplateTokenizer,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        config: RolloutConfig,
        simulator: GenerateBackend | None,
        simulator_tokenizer: ChatTemplateTokenizer | None,
        environment: Environment | None,
        references: list[dict[str, Any]] | None,
        user_turns: list[str] | None = None,
        continue_dialogue: Callable[[list[dict[str, Any]], int], Awaitable[bool]] | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self.environment = environment
        self.registry = ToolRegistry(tools)
        self.messages = list(messages)
        self.act = ChatTokens(tokenizer, self.messages, self.registry.tools,
                              template_kwargs=config.template_kwargs)
        self.segments: list[tuple[TokenRole, int]] = [(TokenRole.PROMPT, len(self.act.ids))]
        self.limit = len(self.act.ids) + config.max_response_tokens
        self.generations: list[Generation] = []
        self.rehearsed: list[tuple[ToolCall | None, RehearsalOutcome]] = []
        self.pending_users = list(user_turns or []) if config.replay_user_turns else []
        self.continue_dialogue = continue_dialogue
        self.user_turn = 0
        self.rehearser: GenerateBackend | None = None
        self.rehearse_ctx: RehearsalContext | None = None
        if config.mode == Mode.REAL:
            if environment is None:
                raise ValueError("mode 'real' needs an environment")
        else:
            self.rehearser = policy if config.mode == Mode.REHEARSAL else simulator
            if self.rehearser is None:
                raise ValueError("mode 'external_simulator' needs a simulator backend")
            rehearse_tok = tokenizer
            if config.mode == Mode.EXTERNAL_SIMULATOR and simulator_tokenizer is not None:
                rehearse_tok = simulator_tokenizer
            self.rehearse_ctx = RehearsalContext(
                rehearse_tok, RehearsalPrompt(config.prompt_name), self.registry, list(messages),
                list(references or []), dict(config.template_kwargs),
                think_switch=config.rehearse_think_switch,
            )

    def _decode(self, tokens: ChatTokens, ids: list[int]) -> str:
        n = len(tokens.turn_end_ids)
        body = ids[:-n] if ids[-n:] == tokens.turn_end_ids else ids
        return tokens.tokenizer.decode(body, skip_special_tokens=False)

    async def _rehearse(self, candidate: CallCandidate, turn: int) -> RehearsalOutcome | None:
        """Ask the rehearsing backend; ``None`` if the REHEARSE context is over its limit. With
        ``rehearse_truncation="left"`` a context over ``max_prompt_tokens`` is cut to its last
        ``max_prompt_tokens`` ids first (the generation's context, the training row's prompt, is the cut
        one; the REHEARSE context itself keeps every id for the next call)."""
        assert self.rehearse_ctx is not None and self.rehearser is not None
        if self.config.mode == Mode.EXTERNAL_SIMULATOR and self.config.simulator_protocol == "single_call":
            return await self._simulate_single_call(candidate, turn)
        context = self.rehearse_ctx.prompt_ids(candidate)
        if self.config.rehearse_truncation == "left" and len(context) > self.config.max_prompt_tokens:
            context = context[len(context) - self.config.max_prompt_tokens:]
        prompt_len = len(context)
        budget = self.config.max_rehearse_context_tokens - prompt_len
        if budget <= 0:
            return None
        params = dict(self.config.rehearse_sampling)
        params["max_tokens"] = min(int(params.get("max_tokens", budget)), budget)
        ids, logprobs = await self.rehearser.generate(list(context), params)
        self.rehearse_ctx.record_response(ids)
        self.generations.append(Generation("rehearse", context, prompt_len, ids, logprobs, turn,
                                           trainable=self.config.mode == Mode.REHEARSAL,
                                           user_turn=self.user_turn))
        assert self.rehearse_ctx.tokens is not None
        outcome = parse_rehearsal_output(
            self._decode(self.rehearse_ctx.tokens, ids),
            terminate_on_malformed=self.config.terminate_on_rehearsal_malformed,
            terminate_on_error=self.config.terminate_on_rehearsal_error,
        )
        self.rehearsed.append((candidate.call, outcome))
        return outcome

    async def _simulate_single_call(self, candidate: CallCandidate, turn: int) -> RehearsalOutcome | None:
        """The authors' caller-only simulator (:mod:`envace.core.single_call`): a fresh chat for this call,
        asked up to ``simulator_attempts`` times for a usable JSON reply (each request one generation,
        not trainable); ``None`` if the chat is over the REHEARSE context limit."""
        assert self.rehearse_ctx is not None and self.rehearser is not None
        if candidate.call is None:  # nothing to simulate: the format error a precheck gives
            outcome = precheck_call(candidate, self.registry, "format")
            assert outcome is not None
        else:
            tokenizer = self.rehearse_ctx.tokenizer
            messages = single_call_messages(candidate.call, self.registry, self.rehearse_ctx.references)
            context = render_chat(tokenizer, messages, add_generation_prompt=True, tokenize=True,
                                  **template_kwargs(False))
            budget = self.config.max_rehearse_context_tokens - len(context)
            if budget <= 0:
                return None
            params = {**self.config.rehearse_sampling, "response_format": SINGLE_CALL_FORMAT}
            params["max_tokens"] = min(int(params.get("max_tokens", budget)), budget)
            outcome, why, attempts = None, "", max(1, self.config.simulator_attempts)
            for _ in range(attempts):
                ids, logprobs = await self.rehearser.generate(list(context), params)
                self.generations.append(Generation("rehearse", list(context), len(context), ids, logprobs,
                                                   turn, trainable=False, user_turn=self.user_turn))
                outcome, why = parse_single_call_reply(tokenizer.decode(ids, skip_special_tokens=True))
                if outcome is not None:
                    break
            if outcome is None:
                outcome = failed_outcome(why, attempts)
        self.rehearsed.append((candidate.call, outcome))
        return outcome

    async def _respond(self, candidate: CallCandidate, turn: int) -> RehearsalOutcome | None:
        """The observation for one call; ``None`` means the context limit was hit."""
        outcome = precheck_call(candidate, self.registry, self.config.precheck)
        if outcome is None and self.config.mode == Mode.REAL:
            if candidate.call is None:
                outcome = precheck_call(candidate, self.registry, "format")
            else:
                assert self.environment is not None
                return RehearsalOutcome(OutcomeKind.RESULT, self.environment.step(candidate.call))
        if outcome is not None:
            if self.rehearse_ctx is not None:
                self.rehearse_ctx.note(candidate, outcome.observation)
                if outcome.kind == OutcomeKind.ERROR and self.config.terminate_on_rehearsal_error:
                    # the authors' harness-side schema errors end the episode like the simulator's
                    outcome = replace(outcome, terminate=True)
            return outcome
        return await self._rehearse(candidate, turn)

    def _finish(self, termination: Termination, turns: int, answer: str | None = None) -> Trajectory:
        encoded = {"act": self.act.encoded_tokens,
                   "rehearse": self.rehearse_ctx.encoded_tokens if self.rehearse_ctx else 0}
        return Trajectory(self.messages, self.generations, termination, self.act.ids, self.segments, turns,
                          answer, encoded, self.user_turn + 1, self.rehearsed)

    async def _next_user_turn(self, turns: int) -> Termination | None:
        """After a final answer: inject the next reference user turn (``None``: ACT goes on) or say why
        the episode ends (the authors' ``ChecklistEnv`` INTERACTING state)."""
        if not self.pending_users:
            return Termination.FINAL_ANSWER
        if turns >= self.config.max_turns or self.user_turn + 1 >= self.config.max_user_turns:
            return Termination.MAX_TURNS
        if self.continue_dialogue is not None and not await self.continue_dialogue(
                list(self.messages), self.user_turn):
            return Termination.DIALOGUE_STOPPED
        user = {"role": "user", "content": self.pending_users.pop(0)}
        self.messages.append(user)
        delta = self.act.append_messages([user])
        self.segments.append((TokenRole.OBSERVATION, len(delta)))
        self.user_turn += 1
        if self.rehearse_ctx is not None:  # the final answer and the new user turn reach REHEARSE too
            self.rehearse_ctx.observe_messages(self.messages[-2:], self.messages)
        return None

    async def run(self) -> Trajectory:
        config = self.config
        if len(self.act.ids) > config.max_prompt_tokens:
            return self._finish(Termination.CONTEXT_LIMIT, 0)
        per_generation = config.context_budget == "per_generation"
        if config.context_budget not in ("per_generation", "episode"):
            raise ValueError(f"context_budget: per_generation or episode, got {config.context_budget!r}")
        if config.turn_cap not in ("every_turn", "user_turn_end"):
            raise ValueError(f"turn_cap: every_turn or user_turn_end, got {config.turn_cap!r}")
        generations = config.max_turns if config.turn_cap == "every_turn" else config.max_env_steps
        for turn in range(generations):
            if per_generation:
                if len(self.act.ids) > config.max_prompt_tokens:
                    return self._finish(Termination.CONTEXT_LIMIT, turn)
                budget = config.max_response_tokens
            else:
                budget = self.limit - len(self.act.ids)
                if budget <= 0:
                    return self._finish(Termination.CONTEXT_LIMIT, turn)
            params = dict(config.act_sampling)
            params["max_tokens"] = min(int(params.get("max_tokens", budget)), budget)
            context = self.act.ids
            prompt_len = len(context)
            ids, logprobs = await self.policy.generate(list(context), params)
            self.act.append_generated(ids)
            self.segments.append((TokenRole.ACT, len(ids)))
            self.generations.append(Generation("act", context, prompt_len, ids, logprobs, turn,
                                               user_turn=self.user_turn))
            text = self._decode(self.act, ids)
            if not per_generation and len(self.act.ids) >= self.limit and not self.act.ends_turn():
                self.messages.append(assistant_message(text))
                return self._finish(Termination.CONTEXT_LIMIT, turn + 1)
            parsed = parse_tool_calls(text, parameters_key=config.parameters_key)
            if parsed.error is not None:
                self.messages.append(assistant_message(text))
                if config.on_act_parse_error == "terminate":
                    return self._finish(Termination.ACT_PARSE_ERROR, turn + 1)
                candidates = [CallCandidate(None, text, parsed.error)]
            elif not parsed.calls:
                self.messages.append(_with_reasoning(assistant_message(parsed.final_answer or ""), text))
                ended = await self._next_user_turn(turn + 1)
                if ended is not None:
                    return self._finish(ended, turn + 1, parsed.final_answer)
                if not per_generation and len(self.act.ids) >= self.limit:
                    return self._finish(Termination.CONTEXT_LIMIT, turn + 1, parsed.final_answer)
                continue
            else:
                message = assistant_message(parsed.final_answer or "", parsed.calls)
                self.messages.append(_with_reasoning(message, text))
                candidates = [CallCandidate(call, text) for call in parsed.calls]
            observations = []
            for candidate in candidates:
                outcome = await self._respond(candidate, turn)
                if outcome is None:
                    self.messages.extend(observations)
                    return self._finish(Termination.CONTEXT_LIMIT, turn + 1)
                name = candidate.call.name if candidate.call is not None else None
                observations.append(tool_message(outcome.observation, name))
                if outcome.terminate:
                    self.messages.extend(observations)
                    reason = (Termination.REHEARSAL_MALFORMED if outcome.kind == OutcomeKind.MALFORMED
                              else Termination.REHEARSAL_ERROR)
                    return self._finish(reason, turn + 1)
            self.messages.extend(observations)
            delta = self.act.append_messages(observations)
            self.segments.append((TokenRole.OBSERVATION, len(delta)))
            if not per_generation and len(self.act.ids) >= self.limit:
                return self._finish(Termination.CONTEXT_LIMIT, turn + 1)
        return self._finish(Termination.MAX_TURNS, generations)


async def run_rollout(
    policy: GenerateBackend,
    tokenizer: ChatTemplateTokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    config: RolloutConfig | None = None,
    *,
    simulator: GenerateBackend | None = None,
    simulator_tokenizer: ChatTemplateTokenizer | None = None,
    environment: Environment | None = None,
    references: list[dict[str, Any]] | None = None,
    user_turns: list[str] | None = None,
    continue_dialogue: Callable[[list[dict[str, Any]], int], Awaitable[bool]] | None = None,
) -> Trajectory:
    """Roll out one trajectory.

    Args:
        policy: the trained policy (ACT; also REHEARSE in ``rehearsal`` mode).
        tokenizer: the policy's tokenizer (chat template, eos = turn end).
        messages: the task's initial chat (system / user), OpenAI-style.
        tools: the task's tools (OpenAI-style or bare function specs).
        config: :class:`RolloutConfig` (defaults if ``None``).
        simulator: the answering backend in ``external_simulator`` mode.
        simulator_tokenizer: its tokenizer, if different from ``tokenizer``.
        environment: the environment in ``real`` mode.
        references: reference ``{"call", "response"}`` pairs for the rehearsal prompt (never shown to ACT).
        user_turns: the reference dialogue's later user messages (contents of user turns 1..n-1), replayed
            after each final answer when ``config.replay_user_turns`` (training only).
        continue_dialogue: optional ``async (messages, user_turn) -> bool`` asked before each replayed
            user turn (``user_turn``: index of the turn just answered); ``False`` ends the episode.
    """
    run = _Run(policy, tokenizer, messages, tools, config or RolloutConfig(), simulator, simulator_tokenizer,
               environment, references, user_turns, continue_dialogue)
    return await run.run()

