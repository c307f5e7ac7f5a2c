"""BFCL-v4 agentic categories — memory (:mod:`envace.bench.bfcl.memory`) and web search
(:mod:`envace.bench.bfcl.web`): tasks, isolated episodes, bfcl-eval's own checker, gold scripts.

Implemented:
- Data: bfcl-eval's own loader ``bfcl_eval.utils.load_dataset_entry(category)``: test entries with
  bfcl-eval's answer-format system message (``ADDITIONAL_SYSTEM_PROMPT_FOR_AGENTIC_RESPONSE_FORMAT``) and
  function docs, memory prerequisite entries with their chain order; ground truth from
  ``possible_answer`` (matched by bfcl-eval's id renaming). ``memory.scenarios`` (config) may restrict the
  memory scenarios (a subset, as ``limit`` is); ``limit`` applies to each category's questions, and a
  scenario's whole prerequisite chain runs whenever one of its questions does.
- :func:`prerequisite_stages`: the chains as stages — stage ``i`` holds the ``i``-th prerequisite
  conversation of every scenario in the run — which :func:`envace.bench.runner.run_samples` runs in order
  before the questions (their result lines go to a side file, not into the score).
- :class:`AgenticEpisode`: one fresh instance of the backend class per episode (memory: bfcl-eval's
  ``MemoryAPI_<backend>``; web search: :func:`envace.bench.bfcl.web.web_search_api_class`), configured by
  bfcl-eval's own ``_load_scenario``; a parsed call goes to a whitelisted public method
  (``method(**arguments)``), results stringified as bfcl-eval does, exceptions become
  ``"Error during execution: ..."``. The system prompt is bfcl-eval's (memory: with the memory content at
  the episode's start). A prerequisite conversation's episode flushes the memory with bfcl-eval's
  ``_flush_memory_to_local_file`` when it ends and stores the snapshot for its successor; it is not scored
  (score 0, ``extra.prerequisite``).
- Scoring: bfcl-eval's ``agentic_checker`` on the last text message of the agent (one of the possible
  answers contained, after ``standardize_string``): score 1 or 0, the error type in ``extra``. Like
  bfcl-eval, only the final answer is checked, not the calls.
- :func:`gold_turns` / :func:`gold_answer`: the scripted agent of ``envace selfcheck bfcl_agentic``
  (memory: one write per prerequisite conversation, one retrieval per question, then the answer; web
  search: one search per ground-truth sub-question and a fetch of the last source page, then the answer)
  and :func:`gold_cache_records`, the cache that answers those requests from bfcl-eval's ground truth
  (``source``: sub-question, answer, URL) — synthetic pages, clearly not the web.
"""

from __future__ import annotations

import inspect
import sys
import tempfile
from pathlib import Path
from typing import Any

from envace.bench.bfcl.memory import (
    SnapshotStore,
    memory_backend_class,
    memory_system_prompt,
    snapshot_target,
)
from envace.bench.bfcl.web import WebBackend, web_search_api_class
from envace.core.environment import Score, Task
from envace.core.tools import ToolCall

__all__ = ["MEMORY_SPLITS", "WEB_SEARCH_SPLITS", "load_agentic_tasks", "prerequisite_stages",
           "AgenticEpisode", "AgenticResources", "gold_turns", "gold_answer", "gold_cache_records"]

MEMORY_SPLITS = ("memory_kv", "memory_vector", "memory_rec_sum")
WEB_SEARCH_SPLITS = ("web_search_base", "web_search_no_snippet")


def _split_messages(turn: list[dict[str, Any]]) -> tuple[str | None, str]:
    system = "\n\n".join(m["content"] for m in turn if m["role"] == "system") or None
    user = "\n\n".join(m["content"] for m in turn if m["role"] != "system")
    return system, user


def load_agentic_tasks(split: str, limit: int | None, scenarios: list[str] | None = None) -> list[Task]:
    """The tasks of one agentic category: memory prerequisite conversations first (``meta.prerequisite``),
    then the questions, both in bfcl-eval's order."""
    from envace.bench.bfcl.common import bfcl_eval_package, to_openai_tool

    bfcl_eval_package()
    from bfcl_eval.utils import is_memory_prereq, load_dataset_entry, load_ground_truth_entry

    entries = load_dataset_entry(split, include_prereq=True, include_language_specific_hint=False)
    answers = {a["id"].replace("memory", split, 1).replace("web_search", split, 1): a
               for a in load_ground_truth_entry(split)}
    if split not in MEMORY_SPLITS:
        scenarios = None
    questions = [e for e in entries if not is_memory_prereq(e["id"])
                 and (scenarios is None or e.get("scenario") in scenarios)]
    questions = questions[: limit if limit is not None else None]
    used = {e.get("scenario") for e in questions}
    prereqs = [e for e in entries if is_memory_prereq(e["id"]) and e.get("scenario") in used]
    prereq_ids = {e["id"] for e in prereqs}
    tasks = []
    for entry in prereqs + questions:
        system, first = _split_messages(entry["question"][0])
        meta: dict[str, Any] = {"entry": entry, "prerequisite": entry["id"] in prereq_ids}
        if meta["prerequisite"]:
            meta["predecessor"] = entry["depends_on"][-1] if entry["depends_on"] else None
        elif split in MEMORY_SPLITS:
            chain = [p["id"] for p in prereqs if p["scenario"] == entry["scenario"]]
            meta["predecessor"] = chain[-1] if chain else None
        if not meta["prerequisite"]:
            meta["ground_truth"] = answers[entry["id"]]["ground_truth"]
            # web search: (sub-question, answer, URL) per step, for the gold script and its cache
            meta["sources"] = [s for s in answers[entry["id"]].get("source") or []
                               if isinstance(s, dict) and s.get("subquestion") and s.get("source")]
        tools = [to_openai_tool(d) for d in entry["function"]]
        tasks.append(Task(task_id=entry["id"], split=split, system=system, first_user=first, tools=tools,
                          meta=meta))
    return tasks


def prerequisite_stages(tasks: list[Task]) -> list[list[Task]]:
    """Stage ``i`` = the ``i``-th prerequisite conversation of every (category, scenario) chain."""
    chains: dict[tuple[str, str], list[Task]] = {}
    for task in tasks:
        if task.meta.get("prerequisite"):
            chains.setdefault((task.split, task.meta["entry"]["scenario"]), []).append(task)
    depth = max((len(c) for c in chains.values()), default=0)
    return [[c[i] for c in chains.values() if i < len(c)] for i in range(depth)]


class AgenticResources:
    """What agentic episodes share inside one adapter: the memory encoder settings, the snapshot store
    and the web backend (built on first use, so a run without these categories needs none of it)."""

    def __init__(self, config: dict[str, Any], work_dir: str | Path | None) -> None:
        self.memory = dict(config.get("memory") or {})
        self.web = dict(config.get("web_search") or {})
        self._work_dir = Path(work_dir) if work_dir is not None else None
        self._store: SnapshotStore | None = None
        self._web_backend: WebBackend | None = None

    @property
    def store(self) -> SnapshotStore:
        """The memory chains' snapshots, under ``work_dir`` (a new temporary folder when none was given)."""
        if self._store is None:
            root = self._work_dir or Path(tempfile.mkdtemp(prefix="envace-bfcl-"))
            self._store = SnapshotStore(root / "memory_snapshots")
        return self._store

    def encoder(self) -> tuple[str, str]:
        return str(self.memory.get("encoder", "hashing")), str(self.memory.get("device", "cpu"))

    def web_backend(self) -> WebBackend:
        if self._web_backend is None:
            cfg = self.web
            mode = str(cfg.get("mode", "replay"))
            cache = cfg.get("cache")
            if not cache:
                raise ValueError("benchmarks.bfcl_v4.web_search.cache: no cache file configured for the "
                                 "web-search categories")
            if mode == "replay" and not Path(cache).exists():
                raise ValueError(f"benchmarks.bfcl_v4.web_search.cache: {cache} does not exist; mode replay "
                                 "answers only from a recorded cache (set mode: live with a SerpAPI key to "
                                 "record one)")
            self._web_backend = WebBackend(mode, cache, str(cfg.get("api_key_env", "SERPAPI_API_KEY")),
                                           float(cfg.get("fetch_timeout_s", 20)),
                                           int(cfg.get("fetch_max_bytes", 2_000_000)))
        return self._web_backend

    def versions(self, splits: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        if "memory_vector" in splits:
            out["bfcl_memory_encoder"] = self.encoder()[0]
        if any(s in WEB_SEARCH_SPLITS for s in splits):
            out.update(self.web_backend().record())
        return out


class AgenticEpisode:
    """One isolated agentic episode (see the module docstring)."""

    def __init__(self, task: Task, sample: int, seed: int, resources: AgenticResources) -> None:
        from envace.bench.bfcl.common import format_result

        self.task, self.sample, self.seed = task, sample, seed
        self.entry = task.meta["entry"]
        self.format_result = format_result
        self.store = resources.store
        self.turn = 0
        self.last_text: str | None = None
        self.extra: dict[str, Any] = {}
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if task.split in WEB_SEARCH_SPLITS:
            self.instance = web_search_api_class()()
            self.instance._load_scenario({"show_snippet": task.split != "web_search_no_snippet"})
            self.instance.backend = resources.web_backend()
        else:
            self.instance = memory_backend_class(task.split, *resources.encoder())()
            self._tmp = tempfile.TemporaryDirectory(prefix="envace-bfcl-memory-")
            result_dir = Path(self._tmp.name)
            scenario = self.entry["scenario"]
            if task.meta["prerequisite"]:
                self.store.drop(seed, sample, task.split, task.task_id)
            if not self.store.place(seed, sample, task.split, task.meta["predecessor"],
                                    snapshot_target(result_dir, task.task_id, scenario)):
                self.extra["prerequisite_snapshot_missing"] = task.meta["predecessor"]
            self.instance._load_scenario({"model_result_dir": result_dir, "scenario": scenario,
                                          "test_id": task.task_id, "test_category": task.split})
        self.methods = {name: method for name, method in inspect.getmembers(self.instance, inspect.ismethod)
                        if not name.startswith("_")}

    def system_prompt(self) -> str | None:
        """The agent's system message (memory: with the memory content this episode starts from)."""
        if self.task.split in MEMORY_SPLITS:
            return memory_system_prompt(self.task.split, self.entry["scenario"], self.instance,
                                        self.task.system)
        return self.task.system

    def current_tools(self) -> list[dict[str, Any]]:
        return self.task.tools

    def step(self, call: ToolCall) -> str:
        method = self.methods.get(call.name)
        if method is None:
            return f"Error during execution: name '{call.name}' is not defined"
        try:
            return self.format_result(method(**dict(call.arguments)))
        except Exception as exc:  # the environment's own error for a bad call
            return f"Error during execution: {exc}"

    def user_reply(self, assistant_text: str) -> str | None:
        self.last_text = assistant_text
        self.turn += 1
        turns = self.entry["question"]
        if self.turn >= len(turns):
            return None
        return _split_messages(turns[self.turn])[1]

    def score(self) -> Score:
        extra = dict(self.extra)
        if self.task.split in WEB_SEARCH_SPLITS:
            extra.update(cache_hits=self.instance.cache_hits, cache_misses=self.instance.cache_misses)
            if self.instance.cache_misses:
                print(f"envace: bfcl web search (replay): {self.instance.cache_misses} request(s) of "
                      f"{self.task.task_id} are not in the recorded cache", file=sys.stderr)
        if self.task.meta["prerequisite"]:
            try:
                self.instance._flush_memory_to_local_file()
                stored = self.store.save(self.seed, self.sample, self.task.split, self.task.task_id,
                                         Path(self.instance.latest_snapshot_file))
            finally:
                self._cleanup()
            return Score(score=0.0, extra={**extra, "prerequisite": True, "snapshot": str(stored),
                                           "turns_answered": self.turn})
        self._cleanup()
        from bfcl_eval.eval_checker.agentic_eval.agentic_checker import agentic_checker

        if self.last_text is None:
            return Score(score=0.0, extra={**extra, "error_type": "agentic:no_last_message"})
        check = agentic_checker(self.last_text, self.task.meta["ground_truth"])
        if check["valid"]:
            return Score(score=1.0, extra=extra)
        return Score(score=0.0, extra={**extra, "error_type": check["error_type"],
                                       "error_message": check["error_message"]})

    def _cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


# --- gold replay -------------------------------------------------------------------------------------

_WRITE = {"memory_kv": "archival_memory_add", "memory_vector": "archival_memory_add",
          "memory_rec_sum": "memory_append"}
_READ = {"memory_kv": "archival_memory_key_search", "memory_vector": "archival_memory_retrieve",
         "memory_rec_sum": "memory_retrieve"}


def gold_answer(task: Task) -> str:
    """The final message of the scripted agent: bfcl-eval's answer format with the first possible answer
    (a prerequisite conversation answers ``noted``)."""
    if task.meta["prerequisite"]:
        return "noted"
    return str({"answer": task.meta["ground_truth"][0], "context": "gold replay"})


def gold_turns(task: Task) -> list[list[ToolCall]]:
    """The scripted agent's calls per user turn (see the module docstring)."""
    turns: list[list[ToolCall]] = [[] for _ in task.meta["entry"]["question"]]
    if task.split in MEMORY_SPLITS:
        if task.meta["prerequisite"]:
            note = task.first_user[:150]
            args = {"key": "note_" + task.task_id.rsplit("-", 1)[1], "value": note} \
                if task.split == "memory_kv" else {"text": note}
            turns[0] = [ToolCall(_WRITE[task.split], args)]
        else:
            args = {} if task.split == "memory_rec_sum" else {"query": task.first_user}
            turns[0] = [ToolCall(_READ[task.split], args)]
        return turns
    sources = task.meta["sources"]
    turns[0] = [ToolCall("search_engine_query", {"keywords": s["subquestion"]}) for s in sources]
    if sources:
        turns[0].append(ToolCall("fetch_url_content", {"url": sources[-1]["source"], "mode": "truncate"}))
    return turns


def gold_cache_records(tasks: list[Task]) -> list[dict[str, Any]]:
    """Cache records answering the gold script's requests: per sub-question a search result pointing at
    its source URL with the sub-answer as snippet; per source page a small HTML page stating the answer."""
    records: list[dict[str, Any]] = []
    for task in tasks:
        if task.split not in WEB_SEARCH_SPLITS:
            continue
        for s in task.meta["sources"]:
            item = {"title": s["subquestion"], "link": s["source"], "snippet": s["answer"]}
            records.append({"kind": "search", "request": {"engine": "duckduckgo", "q": s["subquestion"],
                                                          "kl": "wt-wt"},
                            "response": {"organic_results": [item]}})
            page = f"<html><body><h1>{s['subquestion']}</h1><p>{s['answer']}</p></body></html>"
            records.append({"kind": "fetch", "request": {"url": s["source"]},
                            "response": {"status": 200, "url": s["source"], "text": page}})
    return records
