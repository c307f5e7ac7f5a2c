"""The standard-GRPO baseline's external simulator as the authors' caller-only script runs it.

Implemented (facts from the authors' release at commit 173e941: ``run_checklist_caller_only.sh`` sets no
simulator prompt, so ``mcp_tool.py`` ``MCPChecklistTool.execute`` in httpx mode answers every call with
its fallback instruction; our wording, prompt file ``envace/core/prompts/simulator_single_call.yaml``):

- one fresh two-message chat per call (:func:`single_call_messages`): a system instruction, and a user
  message holding the example's reference calls with their results (all of them, any tool; "none" when
  the example has none), the called tool's name, its input schema (``{}`` for a tool the task does not
  offer) and the call's arguments. No dialogue history, no earlier simulated replies, no error codes.
- the reply is a JSON object ``{"analysis": str, "execution_result": object | array}``, decoded under
  that JSON schema (:data:`RESPONSE_FORMAT`, sent as the request's ``response_format``, as the authors
  do); :func:`parse_single_call_reply` takes ``execution_result`` as the observation, re-serialised
  with ``ensure_ascii=True`` as theirs.
- an unusable reply is asked again, up to ``attempts`` requests in all (the script's
  ``tool_retry_attempts=5`` counts failed requests and unparsable replies alike); after the last, the
  observation is ``{"error": "<why>"}`` and the episode goes on (:func:`failed_outcome`: kind
  ``MALFORMED`` so it is counted, never terminating: that payload carries no ``error_tool_call``, the
  authors' termination marker).

Simplified: the chat is rendered with ``enable_thinking: false`` (the authors' default simulator, an
external gpt-4.1, does not think in its reply; the schema-constrained decoding forbids a think block
anyway); the tool schema is the task's own (the authors look it up by the example's index: the same).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from envace.core.prompts import load_prompt
from envace.core.rehearsal import OutcomeKind, RehearsalOutcome, ToolRegistry
from envace.core.tools import ToolCall, load_model_json

__all__ = ["PROMPT_NAME", "RESPONSE_FORMAT", "single_call_messages", "parse_single_call_reply",
           "failed_outcome"]

PROMPT_NAME = "simulator_single_call"
_FIELDS = ("system", "user", "examples", "no_examples", "pair")

#: The reply's JSON schema as an OpenAI ``response_format`` (the authors': ``analysis`` a string,
#: ``execution_result`` a non-empty object or an array, nothing else).
RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "tool_execution_response",
        "schema": {
            "type": "object",
            "required": ["analysis", "execution_result"],
            "additionalProperties": False,
            "properties": {
                "analysis": {"type": "string"},
                "execution_result": {"anyOf": [
                    {"type": "object", "minProperties": 1, "additionalProperties": True},
                    {"type": "array", "items": {}},
                ]},
            },
        },
    },
}


@cache
def _prompt() -> dict[str, Any]:
    """The prompt file, read once per process (every simulated call uses it)."""
    return load_prompt(PROMPT_NAME, required=_FIELDS)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True)


def single_call_messages(call: ToolCall, registry: ToolRegistry,
                         references: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The simulator's chat for one parsed ``call``: ``[system, user]``. ``references``: the example's
    ``{"call": {"name", "arguments"}, "response": ...}`` items, in order."""
    text = _prompt()
    pairs = []
    for ref in references:
        ref_call = ref.get("call") or {}
        response = ref.get("response")
        pairs.append(text["pair"].format(name=ref_call.get("name", ""),
                                         arguments=_dumps(ref_call.get("arguments", {})),
                                         result=response if isinstance(response, str) else _dumps(response)))
    examples = text["examples"].format(pairs="\n".join(pairs)) if pairs else text["no_examples"]
    schema = next((t["function"].get("parameters") or {} for t in registry.tools
                   if t["function"]["name"] == call.name), {})
    user = text["user"].format(examples=examples, name=call.name, schema=_dumps(schema),
                               arguments=_dumps(call.arguments))
    return [{"role": "system", "content": text["system"]}, {"role": "user", "content": user}]


def parse_single_call_reply(text: str) -> tuple[RehearsalOutcome | None, str]:
    """``(outcome, "")`` for a usable reply, else ``(None, why)``. Never raises. Reasoning up to a
    ``</think>`` is dropped; the reply must be one JSON object (surrounding whitespace allowed) whose
    ``execution_result`` is a non-empty object or an array."""
    think_end = text.find("</think>")
    body = (text[think_end + len("</think>"):] if think_end != -1 else text).strip()
    value, problem = load_model_json(body)
    if problem is not None:
        return None, f"the simulator's reply is not JSON ({problem.value})"
    if not isinstance(value, dict) or "execution_result" not in value:
        return None, "the simulator's reply has no execution_result"
    result = value["execution_result"]
    if not (isinstance(result, list) or (isinstance(result, dict) and result)):
        return None, "the simulator's execution_result is not a non-empty object or an array"
    return RehearsalOutcome(OutcomeKind.RESULT, _dumps(result), result=result), ""


def failed_outcome(why: str, attempts: int) -> RehearsalOutcome:
    """The observation after ``attempts`` unusable replies: ``{"error": why}``, not terminating."""
    return RehearsalOutcome(OutcomeKind.MALFORMED, _dumps({"error": f"{why} (after {attempts} attempts)"}),
                            terminate=False)
