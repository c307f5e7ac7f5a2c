"""BFCL-v4 adapters: ``bfcl_multi_turn`` (:class:`BfclMultiTurnAdapter`, the multi-turn categories,
:mod:`.multi_turn`) and ``bfcl_v4`` (:class:`BfclV4Adapter`, all categories).

- Single-turn categories (non-live, live, irrelevance; :data:`AST_SPLITS`): :class:`BfclV4Adapter`
  loads, runs and scores them with :mod:`envace.bench.bfcl.single_turn` (one assistant turn, calls recorded,
  not
  executed; bfcl-eval's own AST checker and relevance rule). They need neither tree-sitter (only for
  prompt-mode Java/JavaScript text) nor bfcl-eval's provider SDKs (see that module).
  :class:`BfclMultiTurnAdapter` (benchmark ``bfcl_multi_turn``) refuses them and names ``bfcl_v4``.
- Agentic categories (memory_kv, memory_vector, memory_rec_sum, web_search_base,
  web_search_no_snippet): :class:`BfclV4Adapter` runs them through :mod:`envace.bench.bfcl.agentic`
  (bfcl-eval's memory backends chained through prerequisite conversations; web search from a recorded
  cache or live). :class:`BfclMultiTurnAdapter` refuses them and names ``bfcl_v4``. The Overall weighting
  of the pinned version (10/10/10/30/40) is recorded by :meth:`BfclV4Adapter.versions`.
"""

from __future__ import annotations

import inspect
from importlib import metadata
from pathlib import Path
from typing import Any

from envace.bench.bfcl.common import (
    AGENTIC_SPLITS,
    AST_SPLITS,
    MULTI_TURN_SPLITS,
    OVERALL_WEIGHTS,
    data_dir,
    func_docs,
    parse_gold_call,
    read_jsonl,
    to_openai_tool,
)
from envace.bench.bfcl.multi_turn import BfclEpisode, ClassInstances
from envace.core.environment import Services, Task
from envace.core.tools import ToolCall


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
                from envace.bench.bfcl.single_turn import load_ast_tasks

                tasks.extend(load_ast_tasks(split, limit))
                continue
            entries = read_jsonl(data_dir() / f"BFCL_v4_{split}.json")
            answers = {a["id"]: a["ground_truth"]
                       for a in read_jsonl(data_dir() / "possible_answer" / f"BFCL_v4_{split}.json")}
            for entry in entries[: limit if limit is not None else None]:
                tasks.append(self._task(split, entry, answers[entry["id"]]))
        return tasks

    def _task(self, split: str, entry: dict[str, Any], ground_truth: list[list[str]]) -> Task:
        docs = [d for c in entry["involved_classes"] for d in func_docs(c)]
        missed = {t: list(names) for t, names in entry.get("missed_function", {}).items()}
        held = {n for names in missed.values() for n in names}
        holdout = {t: [d for d in docs if d["name"] in names] for t, names in missed.items()}
        tools = [to_openai_tool(d) for d in docs if d["name"] not in held]
        first = "\n\n".join(m["content"] for m in entry["question"][0])
        return Task(task_id=entry["id"], split=split, system=None, first_user=first, tools=tools,
                    meta={"entry": entry, "ground_truth": ground_truth, "holdout": holdout})

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> Any:
        if task.split in AST_SPLITS:
            from envace.bench.bfcl.single_turn import BfclAstEpisode

            return BfclAstEpisode(task)
        return BfclEpisode(task)

    def gold_turns(self, task: Task) -> list[list[ToolCall]]:
        """The ground-truth calls of every user turn as :class:`ToolCall` (positional arguments bound to
        their parameter names), for the self-check replay. A single-turn task has one turn
        (:func:`envace.bench.bfcl.single_turn.gold_calls`)."""
        if task.split in AST_SPLITS:
            from envace.bench.bfcl.single_turn import gold_calls

            return [gold_calls(task)]
        entry = task.meta["entry"]
        instances = ClassInstances(entry, long_context=False) if task.meta["ground_truth"] else None
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
    single-turn (AST) and agentic (:mod:`envace.bench.bfcl.agentic`; ``work_dir`` holds the memory
    chains' snapshots)."""

    name = "bfcl_v4"
    supported = MULTI_TURN_SPLITS + AST_SPLITS + AGENTIC_SPLITS

    def __init__(self, config: dict[str, Any] | None = None, work_dir: str | Path | None = None) -> None:
        super().__init__(config)
        self.work_dir = work_dir
        self._agentic: Any = None

    def agentic(self) -> Any:
        """The shared resources of agentic episodes (:class:`envace.bench.bfcl.agentic.AgenticResources`)."""
        if self._agentic is None:
            from envace.bench.bfcl.agentic import AgenticResources

            self._agentic = AgenticResources(self.config, self.work_dir)
        return self._agentic

    def versions(self) -> dict[str, str]:
        from envace.bench.bfcl.single_turn import checker_provenance

        splits = list(self.config.get("splits") or [])
        return {**super().versions(), "bfcl_ast_checker": checker_provenance(),
                **self.agentic().versions(splits)}

    def load_tasks(self, splits: list[str], limit: int | None) -> list[Task]:
        from envace.bench.bfcl.agentic import load_agentic_tasks

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
        from envace.bench.bfcl.agentic import prerequisite_stages

        return prerequisite_stages(tasks)

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> Any:
        if task.split in AGENTIC_SPLITS:
            from envace.bench.bfcl.agentic import AgenticEpisode

            return AgenticEpisode(task, sample, seed, self.agentic())
        return super().new_episode(task, sample, seed, services)

    def gold_turns(self, task: Task) -> list[list[ToolCall]]:
        if task.split in AGENTIC_SPLITS:
            from envace.bench.bfcl.agentic import gold_turns

            return gold_turns(task)
        return super().gold_turns(task)
