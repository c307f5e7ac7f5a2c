"""World rehearsal (the REHEARSE role): call validation, the rehearsal prompt, and output parsing.

Implemented, following the paper: for each tool call of the ACT role the same policy, prompted as the
environment, (1) checks the call format, (2) checks the tool name against the whitelist of available
tools, (3) validates the arguments against the tool's JSON schema, and (4) otherwise returns an
execution result; errors are the codes ``INVALID_TOOL_CALL_FORMAT``, ``TOOL_NOT_AVAILABLE`` and
``INVALID_PARAMETERS``. The answer is JSON inside ``<execution_result>...</execution_result>``.

- Faithful default (``precheck="none"``): the model performs the validation inside its rehearsal.
- Our extension, ``precheck="format"`` or ``"schema"``: the harness answers invalid calls itself,
  deterministically, before spending rehearsal tokens (``"format"``: step 1 only; ``"schema"``:
  steps 1-3, with the ``jsonschema`` library). A tool whose own schema is invalid, or whose validator
  fails on a call (e.g. a pattern that is not a regular expression), is not prechecked at step 3 (the
  model still sees it). Arguments nested too deeply for the validator (a schema that refers to itself
  through ``$ref``) are ``INVALID_PARAMETERS``: the harness never lets a ``RecursionError`` out.
- :func:`parse_rehearsal_output` is total and linear in its input: the reply's JSON is decoded with
  :func:`envace.core.tools.load_model_json` (strict JSON, valid Unicode, bounded nesting), so whatever the
  rehearser writes becomes a result, an error or a malformed outcome.

The rehearsal prompt is ours (``envace/core/prompts/rehearsal_v2.yaml``, the default; ``rehearsal_v1`` still
selectable). As in the authors' code it is a fresh chat, separate from the ACT context: a system
instruction (the four steps and the error codes), then a user message with the tools, optional reference
call/response pairs from the training example (privileged: never shown to ACT), the conversation so far
and the current call. Unlike the authors' simulator prompt, which re-serialises the whole history for
every call (``envs.py`` ``_build_info``: ``serialize_conversation_history(self.messages[:-1])``),
:class:`RehearsalContext` keeps one growing chat per trajectory: each later call is a new user message
appended after the model's previous ``<execution_result>`` reply, so the token prompt for turn t+1
extends the one for turn t (only the new part is ever encoded). The previous rehearsal replies *are* the
earlier observations; calls answered without the model (prechecks, or a different responder) are listed
in the next user message (``notes``); ACT-chat messages the REHEARSE chat has not seen otherwise — a
final answer and the replayed user turn after it (:meth:`RehearsalContext.observe_messages`) — are
shown there too (``dialogue``, v2), in the order they happened. So every REHEARSE call sees the whole
dialogue so far, as the authors' does, replayed user turns included. v1 (no ``dialogue`` field) shows
such messages only if nothing was rehearsed before them (the first user message's history); v2 renders
exactly as v1 whenever no such message arrived after the first rehearsal (single-turn episodes,
evaluation, test-time scaling, fidelity).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import jsonschema
from jsonschema.exceptions import SchemaError

from envace.core.prompts import load_prompt
from envace.core.tools import (
    MAX_JSON_DEPTH,
    ChatTemplateTokenizer,
    ChatTokens,
    JSONProblem,
    ParseError,
    ToolCall,
    find_block,
    load_model_json,
    transcript,
)

__all__ = [
    "RehearsalError",
    "Precheck",
    "PRECHECK_LEVELS",
    "MALFORMED_CODE",
    "CallCandidate",
    "ToolRegistry",
    "OutcomeKind",
    "RehearsalOutcome",
    "error_observation",
    "precheck_call",
    "parse_rehearsal_output",
    "RehearsalPrompt",
    "RehearsalContext",
]


class RehearsalError(StrEnum):
    """The paper's error codes, in validation order."""

    INVALID_TOOL_CALL_FORMAT = "INVALID_TOOL_CALL_FORMAT"
    TOOL_NOT_AVAILABLE = "TOOL_NOT_AVAILABLE"
    INVALID_PARAMETERS = "INVALID_PARAMETERS"


Precheck = Literal["none", "format", "schema"]
PRECHECK_LEVELS: tuple[str, ...] = ("none", "format", "schema")

#: Error code of the observation given to ACT when a rehearsal reply is malformed (ours).
MALFORMED_CODE = "REHEARSAL_FAILED"

RESULT_OPEN, RESULT_CLOSE = "<execution_result>", "</execution_result>"
_ERROR_CODES = frozenset(code.value for code in RehearsalError)
_PROBLEM_TEXT = {
    JSONProblem.INVALID: "not JSON",
    JSONProblem.LONE_SURROGATE: "a string holds a lone surrogate",
    JSONProblem.TOO_DEEP: f"nested deeper than {MAX_JSON_DEPTH} levels",
}


@dataclass(frozen=True)
class CallCandidate:
    """What the ACT role asked for: the parsed ``call`` (``None`` if its output did not parse), the raw
    ``caller_text`` of its turn, and the parser's ``parse_error`` if any."""

    call: ToolCall | None
    caller_text: str
    parse_error: ParseError | None = None

    def call_json(self) -> str:
        """The call as JSON text (``null`` when unparsed)."""
        if self.call is None:
            return "null"
        return json.dumps({"name": self.call.name, "arguments": self.call.arguments}, ensure_ascii=False)


def _function_spec(tool: dict[str, Any]) -> dict[str, Any]:
    """The ``function`` part of an OpenAI tool (a bare function spec is accepted too)."""
    spec = tool.get("function", tool)
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"tool has no function name: {tool!r}")
    return spec


@functools.lru_cache(maxsize=4096)
def _validator(schema_json: str) -> Any:
    """A validator for a tool's parameter schema (given as canonical JSON), or None if the schema is
    itself invalid. Cached: benchmarks reuse the same tools across thousands of episodes, and checking a
    schema costs far more than validating a call."""
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError:
        return None
    return cls(schema)


class ToolRegistry:
    """The available tools of one task: the whitelist of names and a JSON-schema validator per tool.

    Args:
        tools: OpenAI-style tools (``{"type": "function", "function": {"name", "description",
            "parameters"}}``) or bare function specs.
    """

    def __init__(self, tools: Iterable[dict[str, Any]]) -> None:
        self.tools: list[dict[str, Any]] = []
        self._validators: dict[str, Any] = {}
        for tool in tools:
            spec = _function_spec(tool)
            self.tools.append({"type": "function", "function": spec})
            schema = spec.get("parameters") or {"type": "object"}
            self._validators[spec["name"]] = _validator(json.dumps(schema, sort_keys=True))

    @property
    def names(self) -> list[str]:
        """Tool names, in the given order."""
        return list(self._validators)

    def validate(
        self, candidate: CallCandidate, level: Precheck = "schema"
    ) -> tuple[RehearsalError, str] | None:
        """Run validation steps 1 to 3 (``level="format"``: step 1 only) on a candidate call.

        Returns ``(code, message)`` for the first failed step, or ``None`` if the call passes.
        """
        if candidate.call is None:
            reason = candidate.parse_error.value if candidate.parse_error else "unparsed"
            return RehearsalError.INVALID_TOOL_CALL_FORMAT, f"the tool call could not be parsed ({reason})"
        if level == "format":
            return None
        name = candidate.call.name
        if name not in self._validators:
            return RehearsalError.TOOL_NOT_AVAILABLE, f"no tool named {name!r} is available"
        validator = self._validators[name]
        if validator is None:
            return None
        try:
            error = jsonschema.exceptions.best_match(validator.iter_errors(candidate.call.arguments))
        except RecursionError:
            return RehearsalError.INVALID_PARAMETERS, "arguments: nested too deeply to validate"
        except Exception:  # the tool's schema, not the call, is broken (e.g. a pattern that is no regex)
            return None
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "arguments"
            return RehearsalError.INVALID_PARAMETERS, f"{where}: {error.message}"
        return None


class OutcomeKind(StrEnum):
    """The three kinds of rehearsal outcome."""

    RESULT = "result"
    ERROR = "error"
    MALFORMED = "malformed"


@dataclass(frozen=True)
class RehearsalOutcome:
    """The observation a rehearsal (or a precheck) gives back to ACT.

    ``observation``: the text of the tool message for ACT. ``result``: the decoded JSON for a result.
    ``error``: the code for an error outcome. ``terminate``: whether the rollout should stop here.
    ``prechecked``: answered by the harness, not by a model.
    """

    kind: OutcomeKind
    observation: str
    result: Any = None
    error: RehearsalError | None = None
    terminate: bool = False
    prechecked: bool = False


def error_observation(code: str, message: str) -> str:
    """The JSON text of an error observation: ``{"error": code, "message": message}``."""
    return json.dumps({"error": str(code), "message": message}, ensure_ascii=False)


def precheck_call(
    candidate: CallCandidate, registry: ToolRegistry, level: Precheck
) -> RehearsalOutcome | None:
    """Our extension: answer an invalid call without a model. ``None`` means "rehearse it"."""
    if level not in PRECHECK_LEVELS:
        raise ValueError(f"precheck must be one of {PRECHECK_LEVELS}, got {level!r}")
    if level == "none":
        return None
    failure = registry.validate(candidate, level)
    if failure is None:
        return None
    code, message = failure
    return RehearsalOutcome(OutcomeKind.ERROR, error_observation(code, message), error=code, prechecked=True)


def parse_rehearsal_output(
    text: str, *, terminate_on_malformed: bool = True, terminate_on_error: bool = True
) -> RehearsalOutcome:
    """Parse one REHEARSE reply. Never raises.

    Reasoning up to a ``</think>`` is dropped; the first ``<execution_result>...</execution_result>``
    block must hold JSON. A JSON object whose ``"error"`` is one of :class:`RehearsalError` is an error
    outcome (observation: that object re-serialised); any other JSON value is a result (observation:
    the value re-serialised with ``json.dumps``). No block, or a block that
    :func:`envace.core.tools.load_model_json` refuses (not JSON, a lone surrogate, nested too deeply), is
    malformed: the observation is an error with code :data:`MALFORMED_CODE`. Linear in ``len(text)``.

    ``terminate`` is ``terminate_on_malformed`` for malformed replies and ``terminate_on_error`` for
    error codes. Both default to ``True``: the paper ends an episode on a "simulator error", and the
    authors' code ends it on any tool message carrying an error (``ChecklistEnv.async_step``: a simulator
    reply with ``error_tool_call`` sets ``sim_failed_any`` -> TERMINATED); ``terminate_on_error=False``
    is our earlier lenient rule (the error is observed and ACT goes on).
    """
    think_end = text.find("</think>")
    body = text[think_end + len("</think>") :] if think_end != -1 else text
    block = find_block(body, RESULT_OPEN, RESULT_CLOSE)
    value, problem = (None, None) if block is None else load_model_json(block)
    if block is None or problem is not None:
        message = "the rehearsal reply had no valid <execution_result> JSON block"
        if problem is not None:
            message += f" ({_PROBLEM_TEXT[problem]})"
        return RehearsalOutcome(OutcomeKind.MALFORMED, error_observation(MALFORMED_CODE, message),
                                terminate=terminate_on_malformed)
    error = value.get("error") if isinstance(value, dict) else None
    if isinstance(error, str) and error in _ERROR_CODES:
        code = RehearsalError(error)
        message = value.get("message")
        observation = error_observation(code, message if isinstance(message, str) else "")
        return RehearsalOutcome(OutcomeKind.ERROR, observation, error=code, terminate=terminate_on_error)
    return RehearsalOutcome(OutcomeKind.RESULT, json.dumps(value, ensure_ascii=False), result=value)


class RehearsalPrompt:
    """The versioned rehearsal prompt (``envace/core/prompts/<name>.yaml``) and its rendering into messages.

    ``dialogue`` (optional field, v2): the section listing ACT-chat messages since the last reply;
    :attr:`sees_dialogue` is whether the prompt has it.
    """

    FIELDS = ("system", "first_user", "references", "next_user", "notes", "call")
    OPTIONAL = ("dialogue",)

    def __init__(self, name: str = "rehearsal_v2") -> None:
        data = load_prompt(name, required=self.FIELDS)
        self.version: str = data["version"]
        self.text: dict[str, str] = {key: data[key] for key in self.FIELDS}
        for key in self.OPTIONAL:
            if key in data:
                if not isinstance(data[key], str):
                    raise ValueError(f"prompt file {name}.yaml: {key} must be a string")
                self.text[key] = data[key]
        self.sees_dialogue = "dialogue" in self.text

    def system(self) -> str:
        """The system instruction (the four steps and the error codes)."""
        return self.text["system"].format()

    def call(self, candidate: CallCandidate) -> str:
        """The 'caller output / call to execute' section."""
        return self.text["call"].format(caller_text=candidate.caller_text, call_json=candidate.call_json())

    def first_user(
        self,
        tools: list[dict[str, Any]],
        references: list[dict[str, Any]],
        history: list[dict[str, Any]],
        notes: list[tuple[CallCandidate, str] | dict[str, Any]],
        candidate: CallCandidate,
    ) -> str:
        """The first user message: tools, references (if any), history, notes (if any), first call.

        ``references``: items ``{"call": {...}, "response": ...}`` from the training example.
        ``notes``: as in :meth:`next_user`.
        """
        refs = ""
        if references:
            pairs = "\n".join(json.dumps(r, ensure_ascii=False) for r in references)
            refs = self.text["references"].format(pairs=pairs)
        tools_text = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return self.text["first_user"].format(
            tools=tools_text,
            references=refs,
            history=transcript(history),
            call=self.next_user(notes, candidate),
        )

    def next_user(
        self, notes: list[tuple[CallCandidate, str] | dict[str, Any]], candidate: CallCandidate
    ) -> str:
        """A later user message: what happened since the last reply (if anything), then the call.

        ``notes``: in order, ``(candidate, observation)`` pairs (calls answered elsewhere: the ``notes``
        section) and chat messages (the ``dialogue`` section; dropped by a prompt without one). Each run of
        consecutive entries of one kind is one section, so the order of events is kept.
        """
        sections: list[tuple[str, list[Any]]] = []
        for entry in notes:
            kind = "dialogue" if isinstance(entry, dict) else "notes"
            if kind == "dialogue" and not self.sees_dialogue:
                continue
            if sections and sections[-1][0] == kind:
                sections[-1][1].append(entry)
            else:
                sections.append((kind, [entry]))
        parts = []
        for kind, entries in sections:
            if kind == "notes":
                items = "\n".join(f"{c.call_json()} -> {obs}" for c, obs in entries)
                parts.append(self.text["notes"].format(items=items) + "\n")
            else:
                parts.append(self.text["dialogue"].format(messages=transcript(entries)) + "\n")
        return self.text["next_user"].format(notes="".join(parts), call=self.call(candidate))


@dataclass
class RehearsalContext:
    """One trajectory's REHEARSE chat, kept as growing token ids (prefix-stable across turns).

    Use: :meth:`prompt_ids` for a call -> generate -> :meth:`record_response` with the generated ids;
    :meth:`note` for a call answered without this context (it is mentioned in the next user message);
    :meth:`observe_messages` for ACT-chat messages this context would not see otherwise (a final answer,
    a replayed user turn).

    Attributes:
        tokens: the :class:`ChatTokens` once the first call was seen (``None`` before).
    """

    tokenizer: ChatTemplateTokenizer
    prompt: RehearsalPrompt
    registry: ToolRegistry
    history: list[dict[str, Any]]
    references: list[dict[str, Any]] = field(default_factory=list)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    think_switch: bool = False
    tokens: ChatTokens | None = field(default=None, init=False)
    _notes: list[tuple[CallCandidate, str] | dict[str, Any]] = field(default_factory=list, init=False)

    def note(self, candidate: CallCandidate, observation: str) -> None:
        """Record a call answered without this context."""
        self._notes.append((candidate, observation))

    def observe_messages(self, new: list[dict[str, Any]], dialogue: list[dict[str, Any]]) -> None:
        """ACT-chat messages ``new`` (e.g. a final answer and the replayed user turn after it) were added;
        ``dialogue`` is the whole ACT chat now (it ends with ``new``).

        Before the first rehearsal the history of the first user message becomes ``dialogue`` (it holds
        every call answered so far, so pending notes are dropped with a v2 prompt; v1 kept them). After
        it, ``new`` is shown in the next user message with a prompt that has a ``dialogue`` section
        (v2) and dropped without one (v1).
        """
        if self.tokens is None:
            self.history = list(dialogue)
            if self.prompt.sees_dialogue:
                self._notes.clear()
        elif self.prompt.sees_dialogue:
            self._notes.extend(dict(m) for m in new)

    def prompt_ids(self, candidate: CallCandidate) -> list[int]:
        """The full prompt ids for rehearsing ``candidate``, shape ``(L,)``.

        The first call renders ``[system, first_user]``; later calls append one user message. Returns
        the context's live list (it only ever grows; callers must not mutate it).
        """
        if self.tokens is None:
            messages = [
                {"role": "system", "content": self.prompt.system()},
                {"role": "user", "content": self._user(self.prompt.first_user(
                    self.registry.tools, self.references, self.history, self._notes, candidate))},
            ]
            self.tokens = ChatTokens(self.tokenizer, messages, template_kwargs=self.template_kwargs)
            self._notes.clear()
        else:
            user = {"role": "user", "content": self._user(self.prompt.next_user(self._notes, candidate))}
            self.tokens.append_messages([user])
            self._notes.clear()
        return self.tokens.ids

    def _user(self, content: str) -> str:
        """A user message's text; with :attr:`think_switch`, ending in a blank line and ``/think`` (the
        authors' simulator prompt builder, ``SIM_APPEND_THINK_SWITCH``)."""
        return content + "\n\n/think" if self.think_switch else content

    def record_response(self, response_ids: list[int]) -> None:
        """Append the generated reply ids to the context."""
        if self.tokens is None:
            raise RuntimeError("record_response called before prompt_ids")
        self.tokens.append_generated(response_ids)

    @property
    def encoded_tokens(self) -> int:
        """Token ids produced by encoding text in this context so far."""
        return 0 if self.tokens is None else self.tokens.encoded_tokens
