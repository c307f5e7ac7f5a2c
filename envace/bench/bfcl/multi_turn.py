"""BFCL-v4 multi-turn categories over bfcl-eval's executable classes: the episode.

Implemented:
- Data: the pinned package's own files (``bfcl_eval/data/BFCL_v4_<category>.json``, the
  ``possible_answer`` ground truth and ``multi_turn_func_doc`` function docs). Tools are the involved
  classes' docs converted to OpenAI tool schemas (BFCL's types ``dict``/``float``/``tuple``/``any`` ->
  JSON-schema ``object``/``number``/``array``/no constraint); ``miss_func`` holds its missed functions
  back and adds them at their turn, with bfcl-eval's own user message for that turn
  (``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC``); the episode exposes ``current_tools()``.
- Isolation: every episode constructs its own instances of the involved classes (``cls()`` +
  ``_load_scenario(deepcopy(initial_config[cls]), long_context=...)``, as bfcl-eval does), one set for
  the model and one for the ground truth; bfcl-eval's module-global instance cache is never used.
- Dispatch: a parsed call (name + JSON arguments) goes to a whitelisted public method of the
  episode's instances (``getattr`` on the name only if it is in the whitelist), ``method(**arguments)``;
  results are stringified exactly as bfcl-eval does (str as is, dict as JSON, else ``str``), exceptions
  become ``"Error during execution: ..."``. Unknown names become an error observation. No text is ever
  passed to ``eval``: ground-truth call strings are parsed with :mod:`ast` and ``ast.literal_eval``.
- Scoring: bfcl-eval's own sub-checkers ``state_checker`` and ``response_checker``
  (``bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker``), applied at the end of every user turn
  in the order of its ``multi_turn_checker``: a turn with ground truth but no model call fails
  ("empty_turn_model_response"); otherwise the instance states must match and the ground-truth results
  must be contained in all model results so far. An episode that ends before the last turn fails
  ("force_terminated"), as in bfcl-eval's runner. Score 1 = valid, else 0; the error type goes to
  ``extra``. Simplification: the checks run incrementally on the live instances instead of re-executing
  the decoded calls afterwards; for these deterministic classes that is the same computation.
"""

from __future__ import annotations

import copy
import importlib
import inspect
from typing import Any

from envace.bench.bfcl.common import format_result, parse_gold_call, to_openai_tool
from envace.core.environment import Score, Task
from envace.core.tools import ToolCall


class ClassInstances:
    """Fresh instances of a task's involved classes and their whitelisted public methods."""

    def __init__(self, entry: dict[str, Any], long_context: bool) -> None:
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        for class_name in entry["involved_classes"]:
            cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
            instance = cls()
            if class_name not in STATELESS_CLASSES:
                config = copy.deepcopy(entry.get("initial_config", {}).get(class_name, {}))
                instance._load_scenario(config, long_context=long_context)
            self.instances[class_name] = instance
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = method

    def call(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> str:
        method = self.methods.get(name)
        if method is None:
            return f"Error during execution: name '{name}' is not defined"
        try:
            return format_result(method(*args, **kwargs))
        except Exception as exc:  # the environment's own error for a bad call
            return f"Error during execution: {exc}"


class BfclEpisode:
    """One isolated multi-turn episode (see the module docstring)."""

    def __init__(self, task: Task) -> None:
        from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

        self.task = task
        self.entry = task.meta["entry"]
        self.ground_truth: list[list[str]] = task.meta["ground_truth"]
        long_context = "long_context" in task.split
        self.model = ClassInstances(self.entry, long_context)
        self.gold = ClassInstances(self.entry, long_context)
        self.tools = list(task.tools)
        self.holdout: dict[str, list[dict[str, Any]]] = task.meta.get("holdout", {})
        self.additional_prompt = DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
        self.turn = 0
        self.turn_calls = 0
        self.all_results: list[str] = []
        self.error: dict[str, Any] | None = None
        self.per_turn_calls: list[int] = []

    def current_tools(self) -> list[dict[str, Any]]:
        return self.tools

    def step(self, call: ToolCall) -> str:
        self.turn_calls += 1
        result = self.model.call(call.name, [], dict(call.arguments))
        self.all_results.append(result)
        return result

    def _check_turn(self) -> None:
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker

        gold_calls = self.ground_truth[self.turn]
        gold_results = [self.gold.call(*parse_gold_call(c)) for c in gold_calls]
        self.per_turn_calls.append(self.turn_calls)
        if self.error is not None or not gold_calls:
            return
        if self.turn_calls == 0:
            self.error = {"error_type": "multi_turn:empty_turn_model_response",
                          "error_message": f"Model response list is empty for turn {self.turn}"}
            return
        for check in (state_checker(self.model.instances, self.gold.instances),
                      response_checker(self.all_results, gold_results, self.turn)):
            if not check["valid"]:
                self.error = {"error_type": check["error_type"], "error_message": check["error_message"]}
                return

    def user_reply(self, assistant_text: str) -> str | None:
        self._check_turn()
        self.turn += 1
        self.turn_calls = 0
        if self.turn >= len(self.ground_truth):
            return None
        if str(self.turn) in self.holdout:
            self.tools = self.tools + [to_openai_tool(d) for d in self.holdout[str(self.turn)]]
            return self.additional_prompt
        return "\n\n".join(m["content"] for m in self.entry["question"][self.turn])

    def score(self) -> Score:
        error = self.error
        if error is None and self.turn < len(self.ground_truth):
            error = {"error_type": "multi_turn:force_terminated",
                     "error_message": f"episode ended after {self.turn} of {len(self.ground_truth)} turns"}
        extra = {"calls_per_turn": self.per_turn_calls}
        if error is not None:
            extra.update(error)
        return Score(score=0.0 if error else 1.0, extra=extra)
