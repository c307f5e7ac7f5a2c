"""BFCL-v4 single-turn (AST) categories of the pinned ``bfcl-eval==2026.3.23``.

Categories: simple_python, simple_java, simple_javascript, multiple, parallel, parallel_multiple,
irrelevance, live_simple, live_multiple, live_parallel, live_parallel_multiple, live_irrelevance,
live_relevance (:data:`envace.bench.bfcl.common.AST_SPLITS`).

Implemented:
- Data: bfcl-eval's own loaders ``bfcl_eval.utils.load_dataset_entry`` / ``load_ground_truth_entry``.
  The model sees the function docs as bfcl-eval's generation step prepares them
  (``include_language_specific_hint=True``: the language hint in every description; for Java and
  JavaScript every parameter type becomes ``string`` with the original type named in its description,
  ``_func_doc_language_specific_pre_processing``), converted to OpenAI tool schemas by
  :func:`envace.bench.bfcl.common.to_openai_tool`. The checker gets the docs as bfcl-eval's ``evaluate_task``
  loads them (``include_language_specific_hint=False``: original Java/JavaScript type names). Ground truth
  is aligned with the prompts by index (as ``_subset_entries_by_model_ids``; the ids agree).
- Opening: the system messages of ``question[0]`` become the task's system prompt and its other messages'
  contents, joined by a blank line, the first user message. Simplification: in 9 of the 884
  live_irrelevance entries (and no other entry) ``question[0]`` holds more than one non-system message
  (earlier user/assistant exchanges); their contents are folded into that one user message.
- Text answer: an assistant turn without calls decodes to ``[]``, as bfcl-eval's Qwen FC handler
  (``QwenFCHandler.decode_ast``) decodes a reply without ``<tool_call>`` blocks.
- Episode (:class:`BfclAstEpisode`): one assistant turn. Its tool calls are recorded, never executed (no
  tool output exists for these categories); each is answered with :data:`OBSERVATION` because the
  rollout loop needs an observation. The episode declares ``max_act_turns = 1`` and
  ``scores_parse_errors = True`` for the runner (see the class). The runner of this commit reads neither:
  the model continues after the observation and every call made before its text answer is scored, and
  an unparsable output fails the sample (score 0) even in the irrelevance categories.
- Decoding: the recorded calls become bfcl-eval's FC-decoded form ``[{name: {arg: value}}, ...]``
  directly (what its FC handlers' ``decode_ast`` returns); no text is decoded or evaluated.
- Scoring, as bfcl-eval's ``eval_checker.eval_runner``:
  ``_evaluate_single_ast_entry`` -> ``ast_checker.ast_checker(function docs, decoded, ground truth,
  language, category, model)`` (language from ``is_java``/``is_js``, as ``ast_file_runner``) for the AST
  categories; ``_evaluate_single_relevance_entry`` for the others: a call exists iff the decoded output is
  not ``is_empty_output``; irrelevance/live_irrelevance are correct iff no call, live_relevance iff one.
  An output that is neither calls nor text (bad JSON, unclosed block, ... - the episode then never gets a
  ``user_reply``) counts as bfcl-eval's decoding failure: "ast_decoder:decoder_failed" in the AST
  categories, "no call" in the relevance ones (see above for what the runner does with it). A checker
  exception (e.g. a type name bfcl-eval's converters lack) is "ast_checker:exception", where bfcl-eval
  would stop. Score 1 = valid; the error type and message go to ``extra``; calls to a function the task
  does not offer are listed in ``extra["unknown_functions"]``.
- Checker import: ``ast_checker`` imports ``bfcl_eval.constants.model_config``, which imports every
  provider SDK bfcl-eval supports (anthropic, cohere, mistralai, google-genai, writer-sdk, qwen-agent,
  ...); it only reads ``MODEL_CONFIG_MAPPING[model].underscore_to_dot`` (``convert_func_name``). If that
  import fails, :func:`ast_checker_module` imports the checker against a stand-in ``model_config`` holding
  only :data:`CHECKER_MODEL` with ``underscore_to_dot=False`` (bfcl-eval's value for
  ``Qwen/Qwen3-8B-FC``: our tools keep ``.`` in function names, as its Qwen FC handler does) and removes
  the stand-in again. tree-sitter is not needed: it only parses prompt-mode Java/JavaScript text.
- Gold calls (:func:`gold_calls`, for ``envace selfcheck bfcl_ast``): the first acceptable value of every
  ground-truth argument under the checker's rules: a first option ``""`` means "left out", except for a
  required parameter (then its first other option); a parameter the function doc lacks is left out; dict
  and list-of-dict arguments are resolved the same way inside. Java/JavaScript values are written in the
  string form bfcl-eval's type converters read back. Irrelevance categories: no call; live_relevance
  (no ground truth): its first function with no arguments. Six tasks' ground truth is met by no output
  (:data:`KNOWN_UNSATISFIABLE`, with the reason for each).
"""

from __future__ import annotations

import copy
import importlib
import sys
import types
from functools import cache
from typing import Any

from envace.bench.bfcl.common import bfcl_eval_package, to_openai_tool
from envace.core.environment import Score, Task
from envace.core.tools import ToolCall

__all__ = [
    "BfclAstEpisode",
    "CHECKER_MODEL",
    "IRRELEVANCE_SPLITS",
    "KNOWN_UNSATISFIABLE",
    "OBSERVATION",
    "RELEVANCE_SPLITS",
    "ast_checker_module",
    "checker_provenance",
    "gold_calls",
    "load_ast_tasks",
    "score_calls",
]

RELEVANCE_SPLITS = ("irrelevance", "live_irrelevance", "live_relevance")
IRRELEVANCE_SPLITS = ("irrelevance", "live_irrelevance")
#: bfcl-eval's escaped model name (``/`` -> ``_``) whose ``underscore_to_dot`` the checker reads.
CHECKER_MODEL = "Qwen_Qwen3-8B-FC"
OBSERVATION = "The call was recorded. This task is scored on your calls only; no tool output exists."

#: Tasks whose ground truth no output satisfies under bfcl-eval 2026.3.23's own checker (found by the gold
#: replay, each checked by hand against ``ast_checker``); the self-check reports them as known failures.
KNOWN_UNSATISFIABLE = {
    "simple_java_36": "ArrayList of 'any' elements: the Java converter reads every element as a string, "
                      "the ground truth holds an int and a boolean",
    "simple_java_65": "ArrayList of 'any' elements: the Java converter reads every element as a string, "
                      "the ground truth holds booleans",
    "live_simple_106-63-0": "required parameters whose list of acceptable values is empty",
    "live_simple_112-68-0": "required parameters whose list of acceptable values is empty",
    "live_multiple_862-181-3": "the ground truth requires 'journey_start_time', which the function doc lacks",
    "live_multiple_964-207-0": "the ground truth names 'question', which the function doc lacks, and omits "
                               "the required 'statement'",
}

_CHECKER = "bfcl_eval.eval_checker.ast_eval.ast_checker"
_MODEL_CONFIG = "bfcl_eval.constants.model_config"
_stand_in_used = False


def ast_checker_module() -> Any:
    """bfcl-eval's ``ast_checker`` module (see the module docstring for the ``model_config`` stand-in)."""
    global _stand_in_used
    bfcl_eval_package()
    if _CHECKER in sys.modules:
        return sys.modules[_CHECKER]
    try:
        return importlib.import_module(_CHECKER)
    except ImportError:  # model_config imports every provider SDK bfcl-eval supports
        pass
    stand_in = types.ModuleType(_MODEL_CONFIG)
    stand_in.MODEL_CONFIG_MAPPING = {  # type: ignore[attr-defined]
        CHECKER_MODEL.replace("_", "/"): types.SimpleNamespace(underscore_to_dot=False)
    }
    previous = sys.modules.get(_MODEL_CONFIG)
    sys.modules[_MODEL_CONFIG] = stand_in
    try:
        module = importlib.import_module(_CHECKER)
    finally:
        if previous is None:
            sys.modules.pop(_MODEL_CONFIG, None)
        else:
            sys.modules[_MODEL_CONFIG] = previous
    _stand_in_used = True
    return module


def checker_provenance() -> str:
    """How the checker was imported (recorded in manifests)."""
    ast_checker_module()
    if _stand_in_used:
        return f"ast_checker with a stand-in model_config ({CHECKER_MODEL}: underscore_to_dot=False)"
    return f"ast_checker with bfcl-eval's model_config ({CHECKER_MODEL})"


def _language(split: str) -> Any:
    bfcl_eval_package()
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.utils import is_java, is_js

    return Language.JAVA if is_java(split) else Language.JAVASCRIPT if is_js(split) else Language.PYTHON


@cache
def _entries(split: str, hinted: bool) -> tuple[dict[str, Any], ...]:
    bfcl_eval_package()
    from bfcl_eval.utils import load_dataset_entry

    return tuple(load_dataset_entry(split, include_prereq=False, include_language_specific_hint=hinted))


@cache
def _ground_truth(split: str) -> tuple[Any, ...] | None:
    if split in RELEVANCE_SPLITS:
        return None
    bfcl_eval_package()
    from bfcl_eval.utils import load_ground_truth_entry

    return tuple(entry["ground_truth"] for entry in load_ground_truth_entry(split))


def _opening(question: list[list[dict[str, Any]]]) -> tuple[str | None, str]:
    first = question[0]
    system = "\n\n".join(m["content"] for m in first if m["role"] == "system") or None
    return system, "\n\n".join(m["content"] for m in first if m["role"] != "system")


def load_ast_tasks(split: str, limit: int | None) -> list[Task]:
    """The tasks of one AST category, in bfcl-eval's order; at most ``limit``."""
    hinted, plain, truth = _entries(split, True), _entries(split, False), _ground_truth(split)
    tasks = []
    for i, (seen, checked) in enumerate(list(zip(hinted, plain, strict=True))[:limit]):
        if seen["id"] != checked["id"]:
            raise ValueError(f"bfcl-eval {split}: prompt order differs between loads at {i}")
        system, first_user = _opening(seen["question"])
        meta = {"functions": checked["function"], "ground_truth": truth[i] if truth is not None else None}
        tasks.append(Task(task_id=seen["id"], split=split, system=system, first_user=first_user,
                          tools=[to_openai_tool(d) for d in seen["function"]], meta=meta))
    return tasks


def _verdict_ast(task: Task, decoded: list[dict[str, Any]]) -> dict[str, Any]:
    checker = ast_checker_module()
    try:
        return checker.ast_checker(copy.deepcopy(task.meta["functions"]), decoded,
                                   copy.deepcopy(task.meta["ground_truth"]), _language(task.split),
                                   task.split, CHECKER_MODEL)
    except Exception as exc:  # bfcl-eval itself would stop here; for us it is a failed sample
        error = f"{type(exc).__name__}: {exc}"
        return {"valid": False, "error": [error], "error_type": "ast_checker:exception"}


def _verdict_relevance(split: str, decoded: list[dict[str, Any]]) -> dict[str, Any]:
    bfcl_eval_package()
    from bfcl_eval.utils import is_empty_output

    has_call = not is_empty_output(decoded)
    if split in IRRELEVANCE_SPLITS:
        if not has_call:
            return {"valid": True}
        return {"valid": False, "error": ["Valid syntax. Successfully decode AST when it should not."],
                "error_type": "irrelevance_error:decoder_success"}
    if has_call:
        return {"valid": True}
    return {"valid": False, "error": ["Invalid syntax. Failed to decode AST when it should have."],
            "error_type": "relevance_error:decoder_failed"}


def score_calls(task: Task, calls: list[ToolCall], decoded_ok: bool = True) -> Score:
    """bfcl-eval's verdict on ``calls`` (see the module docstring). ``decoded_ok=False``: the model's
    output was neither calls nor text (bfcl-eval's decoding failure)."""
    decoded = [{c.name: copy.deepcopy(dict(c.arguments))} for c in calls]
    offered = {f["name"] for f in task.meta["functions"]}
    extra: dict[str, Any] = {"calls": len(calls)}
    unknown = [c.name for c in calls if c.name not in offered]
    if unknown:
        extra["unknown_functions"] = unknown
    if task.split in RELEVANCE_SPLITS:
        verdict = _verdict_relevance(task.split, decoded)
    elif not decoded_ok and not calls:
        verdict = {"valid": False, "error": ["Invalid syntax. Failed to decode AST."],
                   "error_type": "ast_decoder:decoder_failed"}
    else:
        verdict = _verdict_ast(task, decoded)
    if not verdict["valid"]:
        extra["error_type"] = verdict.get("error_type", "ast_checker:unclear")
        extra["error_message"] = "; ".join(str(e) for e in verdict.get("error", []))
    return Score(score=1.0 if verdict["valid"] else 0.0, extra=extra)


class BfclAstEpisode:
    """One single-turn episode: records the calls of the assistant's turn, scores them at the end;
    ``user_reply`` always ends the conversation.

    Two declarations for the runner (:func:`envace.core.episode.run_episode` does not read them yet):
    ``max_act_turns = 1`` — one assistant turn, after which the conversation is over (bfcl-eval queries
    the model once); ``scores_parse_errors = True`` — an unparsable output is scored by :meth:`score`
    (bfcl-eval: no call; correct in the irrelevance categories) instead of failing the sample.
    """

    max_act_turns = 1
    scores_parse_errors = True

    def __init__(self, task: Task) -> None:
        self.task = task
        self.calls: list[ToolCall] = []
        self.replied = False

    def step(self, call: ToolCall) -> str:
        self.calls.append(call)
        return OBSERVATION

    def user_reply(self, assistant_text: str) -> str | None:
        self.replied = True
        return None

    def score(self) -> Score:
        return score_calls(self.task, self.calls, decoded_ok=self.replied or bool(self.calls))


# ---- gold calls for the self-check --------------------------------------------------------------------

def _first(options: list[Any]) -> Any:
    """The first acceptable value; ``_OMIT`` if it is ``""`` (may be left out) or there is none."""
    return _OMIT if not options or options[0] == "" else options[0]


_OMIT = object()


def _choose(options: list[Any], documented: bool, required: bool) -> Any:
    """The first value of a top-level argument the checker accepts: none for a parameter its function doc
    lacks ("unexpected_param"); for a required one the first option other than ``""`` (``""`` itself
    only if there is no other: a literal empty string passes its string check)."""
    if not documented:
        return _OMIT
    if required:
        real = [o for o in options if o != ""]
        return real[0] if real else "" if options else _OMIT
    return _first(options)


def _resolve_dict(option: dict[str, list[Any]]) -> dict[str, Any]:
    out = {}
    for key, options in option.items():
        value = _first(options)
        if value is not _OMIT:
            out[key] = value
    return out


def _resolve(value: Any, schema: dict[str, Any]) -> Any:
    """Resolve a dict / list-of-dict argument's nested options to their first values."""
    kind = schema.get("type")
    items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
    if kind in ("dict", "HashMap") and isinstance(value, dict):
        return _resolve_dict(value)
    if isinstance(value, list) and items.get("type") == "dict" and all(isinstance(v, dict) for v in value):
        return [_resolve_dict(v) for v in value]
    return value


def _java_scalar(value: Any) -> str:
    """A value as ``parse_java_value`` reads it (untyped collection elements)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


_JAVA_ARRAY_NAMES = {"String": "String", "integer": "int", "long": "long", "char": "char"}


def _java(value: Any, kind: str | None, item: str | None) -> Any:
    """A Java value as the string ``java_type_converter`` turns back into it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind == "long" and isinstance(value, int):
        return f"{value}L"
    if kind == "float" and isinstance(value, int | float):
        return f"{float(value)!r}f"
    if kind == "double" and isinstance(value, int | float):
        return repr(float(value))
    if kind == "Array" and isinstance(value, list):
        name = _JAVA_ARRAY_NAMES.get(item or "", "Object")
        parts = [str(_java(v, item, None)) if item else _java_scalar(v) for v in value]
        return f"new {name}[]{{{', '.join(parts)}}}"
    if kind == "ArrayList" and isinstance(value, list):
        if not value:
            return "new ArrayList<>()"
        quote = {"String": '"', "char": "'"}.get(item or "")
        parts = [f"{quote}{v}{quote}" if quote else str(_java(v, item, None)) if item else _java_scalar(v)
                 for v in value]
        return f"new ArrayList<>(Arrays.asList({', '.join(parts)}))"
    if kind == "HashMap" and isinstance(value, dict):
        puts = " ".join(f'put("{k}", {_java_scalar(v)});' for k, v in value.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
    return value if isinstance(value, str) else str(value)


def _js_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_js_scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_js_scalar(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _js(value: Any, kind: str | None) -> Any:
    """A JavaScript value as the string ``js_type_converter`` turns back into it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind == "Bigint" and isinstance(value, int):
        return f"{value}n"
    if kind == "float" and isinstance(value, int | float):
        text = repr(value)
        return format(value, "f") if "e" in text else text  # its float pattern has no exponent
    if isinstance(value, list | dict):
        return _js_scalar(value)
    return value if isinstance(value, str) else str(value)


def _encode(value: Any, schema: dict[str, Any], split: str) -> Any:
    from bfcl_eval.utils import is_java, is_js

    value = _resolve(value, schema)
    items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
    if is_java(split):
        return _java(value, schema.get("type"), items.get("type"))
    if is_js(split):
        return _js(value, schema.get("type"))
    return value


def gold_calls(task: Task) -> list[ToolCall]:
    """The ground truth as the model's calls (see the module docstring)."""
    if task.split in IRRELEVANCE_SPLITS:
        return []
    if task.meta["ground_truth"] is None:  # live_relevance: any call is correct
        return [ToolCall(task.meta["functions"][0]["name"], {})]
    docs = {f["name"]: f for f in task.meta["functions"]}
    calls = []
    for item in task.meta["ground_truth"]:
        ((name, params),) = item.items()
        doc = docs.get(name, {}).get("parameters", {})
        props, required = doc.get("properties", {}), set(doc.get("required", []))
        arguments = {}
        for param, options in params.items():
            value = _choose(options, param in props, param in required)
            if value is not _OMIT:
                arguments[param] = _encode(copy.deepcopy(value), props.get(param, {}), task.split)
        calls.append(ToolCall(name, arguments))
    return calls
