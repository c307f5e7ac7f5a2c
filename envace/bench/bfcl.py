"""BFCL-v4 (pinned ``bfcl-eval==2026.3.23``): multi-turn categories over its executable classes; the
single-turn (AST) categories through :mod:`envace.bench.bfcl_ast`.

Implemented (multi-turn):
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
- Single-turn categories (non-live, live, irrelevance; :data:`AST_SPLITS`): :class:`BfclV4Adapter`
  loads, runs and scores them with :mod:`envace.bench.bfcl_ast` (one assistant turn, calls recorded, not
  executed; bfcl-eval's own AST checker and relevance rule). They need neither tree-sitter (only for
  prompt-mode Java/JavaScript text) nor bfcl-eval's provider SDKs (see that module).
  :class:`BfclMultiTurnAdapter` (benchmark ``bfcl_multi_turn``) refuses them and names ``bfcl_v4``.
- Agentic categories (memory_kv, memory_vector, memory_rec_sum, web_search_base,
  web_search_no_snippet): :class:`BfclV4Adapter` runs them through :mod:`envace.bench.bfcl_agentic`
  (bfcl-eval's memory backends chained through prerequisite conversations; web search from a recorded
  cache or live). :class:`BfclMultiTurnAdapter` refuses them and names ``bfcl_v4``. The Overall weighting
  of the pinned version (10/10/10/30/40) is recorded by :meth:`BfclV4Adapter.versions`.
- Leaderboard aggregation (:data:`LEADERBOARD_GROUPS`, :func:`leaderboard_weights`,
  :func:`leaderboard_scores`): our implementation of the pinned ``generate_leaderboard_csv`` group
  formulas — Non-live = unweighted mean of (unweighted mean of simple_python/java/javascript), multiple,
  parallel, parallel_multiple; Live = task-count-weighted mean of the four live AST categories;
  Irrelevance = unweighted mean of irrelevance and live_irrelevance; Multi turn = unweighted mean of its
  four categories; Agentic = unweighted mean of (web search mean, memory mean); Overall = 10/10/10/30/40;
  live_relevance is reported but in no group. Where bfcl-eval counts a category or group that did not
  run as 0, we leave it out and re-normalise (the reported value is labelled so; ``overall_leaderboard``
  gives bfcl-eval's zero-filled Overall). The report uses it with config
  ``benchmarks.bfcl_v4.aggregate.method: bfcl_eval``.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from envace.core.environment import Score, Services, Task
from envace.core.tools import ToolCall

__all__ = ["AST_SPLITS", "BfclMultiTurnAdapter", "BfclV4Adapter", "MULTI_TURN_SPLITS", "to_openai_tool",
           "parse_gold_call", "AggNode", "LEADERBOARD_GROUPS", "UNSCORED_SPLITS", "LeaderboardWeights",
           "leaderboard_weights", "leaderboard_scores"]

MULTI_TURN_SPLITS = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                     "multi_turn_long_context")
AST_SPLITS = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel",
              "parallel_multiple", "irrelevance", "live_simple", "live_multiple", "live_parallel",
              "live_parallel_multiple", "live_irrelevance", "live_relevance")
AGENTIC_SPLITS = ("web_search_base", "web_search_no_snippet", "memory_kv", "memory_vector", "memory_rec_sum")
OVERALL_WEIGHTS = "non_live=10,live=10,irrelevance=10,multi_turn=30,agentic=40"

_TYPE_MAP = {"dict": "object", "float": "number", "tuple": "array"}


def _ensure_project_root() -> None:
    """Point bfcl-eval's writable project root at a temp dir (else it writes into site-packages)."""
    if "BFCL_PROJECT_ROOT" not in os.environ:
        os.environ["BFCL_PROJECT_ROOT"] = tempfile.mkdtemp(prefix="envace-bfcl-")


def _bfcl() -> Any:
    _ensure_project_root()
    import bfcl_eval

    return bfcl_eval


@cache
def _data_dir() -> Path:
    return Path(_bfcl().__file__).parent / "data"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@cache
def _func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    path = _data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return tuple(_read_jsonl(path))


def _convert_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_convert_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            if value == "any":
                continue
            out[key] = _TYPE_MAP.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: _convert_schema(sub) for name, sub in value.items()}
        else:
            out[key] = _convert_schema(value)
    return out


def to_openai_tool(doc: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc -> ``{"type": "function", "function": {name, description, parameters}}``."""
    params = _convert_schema(doc.get("parameters", {"type": "dict", "properties": {}}))
    function = {"name": doc["name"], "description": doc.get("description", ""), "parameters": params}
    return {"type": "function", "function": function}


def parse_gold_call(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """Parse a ground-truth call string ``f(a, k=v)`` with :mod:`ast` (literals only, never executed).

    Returns ``(name, positional args, keyword args)``; raises ``ValueError`` for anything else.
    """
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {text!r}")
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
    return node.func.id, args, kwargs


def _format_result(value: Any) -> str:
    """bfcl-eval's stringification of an execution result."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class _Instances:
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
            return _format_result(method(*args, **kwargs))
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
        self.model = _Instances(self.entry, long_context)
        self.gold = _Instances(self.entry, long_context)
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


class BfclMultiTurnAdapter:
    """BFCL-v4 multi-turn categories (config ``benchmarks.bfcl_multi_turn``)."""

    name = "bfcl_multi_turn"
    supported = MULTI_TURN_SPLITS

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = dict(config or {})

    def versions(self) -> dict[str, str]:
        return {"bfcl-eval": metadata.version("bfcl-eval"), "bfcl_overall_weights": OVERALL_WEIGHTS}

    def _check_splits(self, splits: list[str]) -> None:
        for split in splits:
            if split in self.supported:
                continue
            if split in AST_SPLITS:
                why = "it is a single-turn (AST) category: run it with benchmark bfcl_v4"
            elif split in AGENTIC_SPLITS:
                why = "it is an agentic category: run it with benchmark bfcl_v4"
            else:
                why = "unknown BFCL category"
            raise ValueError(f"{self.name}: split {split!r} is not supported: {why}; supported: "
                             f"{', '.join(self.supported)}")

    def load_tasks(self, splits: list[str], limit: int | None) -> list[Task]:
        self._check_splits(splits)
        tasks = []
        for split in splits:
            if split in AST_SPLITS:
                from envace.bench.bfcl_ast import load_ast_tasks

                tasks.extend(load_ast_tasks(split, limit))
                continue
            entries = _read_jsonl(_data_dir() / f"BFCL_v4_{split}.json")
            answers = {a["id"]: a["ground_truth"]
                       for a in _read_jsonl(_data_dir() / "possible_answer" / f"BFCL_v4_{split}.json")}
            for entry in entries[: limit if limit is not None else None]:
                tasks.append(self._task(split, entry, answers[entry["id"]]))
        return tasks

    def _task(self, split: str, entry: dict[str, Any], ground_truth: list[list[str]]) -> Task:
        docs = [d for c in entry["involved_classes"] for d in _func_docs(c)]
        missed = {t: list(names) for t, names in entry.get("missed_function", {}).items()}
        held = {n for names in missed.values() for n in names}
        holdout = {t: [d for d in docs if d["name"] in names] for t, names in missed.items()}
        tools = [to_openai_tool(d) for d in docs if d["name"] not in held]
        first = "\n\n".join(m["content"] for m in entry["question"][0])
        return Task(task_id=entry["id"], split=split, system=None, first_user=first, tools=tools,
                    meta={"entry": entry, "ground_truth": ground_truth, "holdout": holdout})

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> Any:
        if task.split in AST_SPLITS:
            from envace.bench.bfcl_ast import BfclAstEpisode

            return BfclAstEpisode(task)
        return BfclEpisode(task)

    def gold_turns(self, task: Task) -> list[list[ToolCall]]:
        """The ground-truth calls of every user turn as :class:`ToolCall` (positional arguments bound to
        their parameter names), for the self-check replay. A single-turn task has one turn
        (:func:`envace.bench.bfcl_ast.gold_calls`)."""
        if task.split in AST_SPLITS:
            from envace.bench.bfcl_ast import gold_calls

            return [gold_calls(task)]
        instances = _Instances(task.meta["entry"], long_context=False) if task.meta["ground_truth"] else None
        turns = []
        for calls in task.meta["ground_truth"]:
            out = []
            for text in calls:
                name, args, kwargs = parse_gold_call(text)
                assert instances is not None
                bound = inspect.signature(instances.methods[name]).bind_partial(*args, **kwargs)
                out.append(ToolCall(name, dict(bound.arguments)))
            turns.append(out)
        return turns


class BfclV4Adapter(BfclMultiTurnAdapter):
    """BFCL-v4 (config ``benchmarks.bfcl_v4``): every category of the leaderboard's Overall — multi-turn,
    single-turn (AST) and agentic (:mod:`envace.bench.bfcl_agentic`; ``work_dir`` holds the memory
    chains' snapshots)."""

    name = "bfcl_v4"
    supported = MULTI_TURN_SPLITS + AST_SPLITS + AGENTIC_SPLITS

    def __init__(self, config: dict[str, Any] | None = None, work_dir: str | Path | None = None) -> None:
        super().__init__(config)
        self.work_dir = work_dir
        self._agentic: Any = None

    def agentic(self) -> Any:
        """The shared resources of agentic episodes (:class:`envace.bench.bfcl_agentic.AgenticResources`)."""
        if self._agentic is None:
            from envace.bench.bfcl_agentic import AgenticResources

            self._agentic = AgenticResources(self.config, self.work_dir)
        return self._agentic

    def versions(self) -> dict[str, str]:
        from envace.bench.bfcl_ast import checker_provenance

        splits = list(self.config.get("splits") or [])
        return {**super().versions(), "bfcl_ast_checker": checker_provenance(),
                **self.agentic().versions(splits)}

    def load_tasks(self, splits: list[str], limit: int | None) -> list[Task]:
        from envace.bench.bfcl_agentic import load_agentic_tasks

        self._check_splits(splits)
        scenarios = (self.config.get("memory") or {}).get("scenarios")
        tasks = []
        for split in splits:
            if split in AGENTIC_SPLITS:
                tasks.extend(load_agentic_tasks(split, limit, scenarios))
            else:
                tasks.extend(super().load_tasks([split], limit))
        return tasks

    def prerequisite_stages(self, tasks: list[Task]) -> list[list[Task]]:
        """Memory prerequisite conversations, run before every other task (see the runner)."""
        from envace.bench.bfcl_agentic import prerequisite_stages

        return prerequisite_stages(tasks)

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> Any:
        if task.split in AGENTIC_SPLITS:
            from envace.bench.bfcl_agentic import AgenticEpisode

            return AgenticEpisode(task, sample, seed, self.agentic())
        return super().new_episode(task, sample, seed, services)

    def gold_turns(self, task: Task) -> list[list[ToolCall]]:
        if task.split in AGENTIC_SPLITS:
            from envace.bench.bfcl_agentic import gold_turns

            return gold_turns(task)
        return super().gold_turns(task)


# --- Leaderboard aggregation --------------------------------------------------------------------------
# Our own implementation of the group formulas of the pinned bfcl-eval 2026.3.23
# (``bfcl_eval/eval_checker/eval_runner_helper.py``, ``generate_leaderboard_csv``); the test
# ``tests/eval/test_metric_rules.py`` checks it against that function. Used by the report when
# ``benchmarks.bfcl_v4.aggregate.method`` is ``bfcl_eval`` (envace.report.evaluations).


@dataclass(frozen=True)
class AggNode:
    """One aggregation step: ``mean`` = unweighted mean of the children's values (bfcl-eval
    ``calculate_unweighted_accuracy``); ``count`` = mean of the children's values weighted by their task
    counts (``calculate_weighted_accuracy``). A child is a category (split) name or another node."""

    rule: Literal["mean", "count"]
    children: tuple[str | AggNode, ...]


#: bfcl-eval's Overall groups: name -> (Overall weight, how the group value is computed from categories).
#: ``live_relevance`` is in none of them (bfcl-eval reports it as "Relevance Detection", outside Overall).
LEADERBOARD_GROUPS: dict[str, tuple[float, AggNode]] = {
    "non_live": (10.0, AggNode("mean", (
        AggNode("mean", ("simple_python", "simple_java", "simple_javascript")),
        "multiple", "parallel", "parallel_multiple"))),
    "live": (10.0, AggNode("count", (
        "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"))),
    "irrelevance": (10.0, AggNode("mean", ("irrelevance", "live_irrelevance"))),
    "multi_turn": (30.0, AggNode("mean", MULTI_TURN_SPLITS)),
    "agentic": (40.0, AggNode("mean", (
        AggNode("mean", ("web_search_base", "web_search_no_snippet")),
        AggNode("mean", ("memory_kv", "memory_vector", "memory_rec_sum"))))),
}
#: Categories bfcl-eval reports but weights into no Overall group.
UNSCORED_SPLITS = ("live_relevance",)


def _node_weights(node: AggNode, counts: Mapping[str, float]) -> dict[str, float]:
    """Weight of each present category in ``node``'s value (summing to 1); ``{}`` if none is present.

    A child without any present category is left out and the remaining children share the node's value
    (unweighted or by their summed task counts): the re-normalisation over what ran.
    """
    parts: list[tuple[float, dict[str, float]]] = []
    for child in node.children:
        if isinstance(child, AggNode):
            inner = _node_weights(child, counts)
            if inner:
                parts.append((sum(counts[c] for c in inner), inner))
        elif counts.get(child, 0) > 0:
            parts.append((float(counts[child]), {child: 1.0}))
    if not parts:
        return {}
    shares = [1.0 / len(parts)] * len(parts) if node.rule == "mean" else [n / sum(n for n, _ in parts)
                                                                            for n, _ in parts]
    return {c: share * w for share, (_, inner) in zip(shares, parts, strict=True) for c, w in inner.items()}


@dataclass(frozen=True)
class LeaderboardWeights:
    """The bfcl-eval aggregation restricted to the categories that ran.

    ``within[g][c]``: weight of category ``c`` in group ``g``'s value (sums to 1 per group);
    ``group_weights``: Overall weights of the groups that ran (raw, e.g. 10/10/10/30);
    ``dropped_groups`` / ``dropped_categories``: leaderboard groups / categories without any task.
    """

    within: dict[str, dict[str, float]]
    group_weights: dict[str, float]
    dropped_groups: tuple[str, ...]
    dropped_categories: tuple[str, ...]

    def category_weights(self) -> dict[str, float]:
        """Weight of each category in the re-normalised Overall (sums to 1)."""
        total = sum(self.group_weights.values())
        return {c: self.group_weights[g] / total * w
                for g, inner in self.within.items() for c, w in inner.items()}


def leaderboard_weights(counts: Mapping[str, float],
                        groups: Mapping[str, tuple[float, AggNode]] | None = None) -> LeaderboardWeights:
    """Weights of :data:`LEADERBOARD_GROUPS` (or ``groups``) for the categories with ``counts[c] > 0``
    tasks (see :func:`_node_weights` for categories and groups that did not run)."""
    groups = LEADERBOARD_GROUPS if groups is None else groups
    within, weights = {}, {}
    for name, (weight, node) in groups.items():
        inner = _node_weights(node, counts)
        if inner:
            within[name], weights[name] = inner, float(weight)

    def leaves(node: AggNode) -> list[str]:
        return [x for c in node.children for x in (leaves(c) if isinstance(c, AggNode) else [c])]

    every = [c for _, node in groups.values() for c in leaves(node)]
    return LeaderboardWeights(within, weights, tuple(g for g in groups if g not in within),
                              tuple(c for c in every if counts.get(c, 0) <= 0))


def leaderboard_scores(accuracy: Mapping[str, float], counts: Mapping[str, float]) -> dict[str, float]:
    """Group values and Overall from per-category accuracies and task counts (categories absent from
    ``accuracy`` did not run).

    ``overall``: weighted mean of the groups that ran, weights re-normalised (our reported value);
    ``overall_leaderboard``: bfcl-eval's Overall, where a group that did not run counts as 0 with its
    weight (so ``overall_leaderboard = overall * sum(weights that ran) / 100``).
    """
    lw = leaderboard_weights({c: n for c, n in counts.items() if c in accuracy})
    out = {g: sum(w * accuracy[c] for c, w in inner.items()) for g, inner in lw.within.items()}
    ran = sum(lw.group_weights.values())
    out["overall"] = sum(lw.group_weights[g] * out[g] for g in lw.within) / ran if ran else 0.0
    total = sum(w for w, _ in LEADERBOARD_GROUPS.values())
    out["overall_leaderboard"] = out["overall"] * ran / total
    return out
