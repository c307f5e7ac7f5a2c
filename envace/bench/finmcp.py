"""FinMCP-Bench (aliyun/qwen-dianjin, ``DianJin-TIR``): loader, gold replay cache, TP / TR / TF1.

Implemented:
- Loader for the published data files (``benchmark_final.json`` and the per-type files; a JSON list, or
  JSON lines, of samples with ``id``, ``scenery``, ``diff_level``, ``tool_list``, ``question``, ``messages``
  — the expert-checked gold conversation with OpenAI-style ``tool_calls`` / ``tool`` messages — and
  optionally ``task``). Samples flagged ``error`` are dropped, as the authors' evaluation does by default.
  Config: ``benchmarks.finmcp.data`` (the data file; default ``data/finmcp/benchmark_final.json``);
  split ``all``, or a task type (``single_step`` / ``multi_step`` / ``multi_turn``, from the sample's
  ``task`` field).
- Replay cache (no live financial MCP server): every tool output of the gold messages, keyed by
  (tool name, canonical JSON arguments). A call with the exact gold name and arguments gets that output;
  a call of a gold tool with other arguments gets the first gold output of that tool (a
  simplification: the real server would answer differently); any other tool gets an error observation.
  Tools offered to the agent: the published data carries no schemas (they come from the live MCP
  server), so each gold tool gets a schema with the argument names and JSON types seen in the gold calls
  (a simplification; documented in the README of this benchmark area).
- User turns: the gold conversation's user messages in order (multi-turn samples); ``None`` after the last.
- Metrics exactly as the authors' ``eval/evaluation.py`` defines them: only tool names count; per sample
  TP = |pred ∩ gold| (multiset intersection), FP = |pred − gold|, FN = |gold − pred|; TP-rate
  ``tp`` = TP/(TP+FP) (tool precision), ``tr`` = TP/(TP+FN) (tool recall), ``tf1`` = 2·tp·tr/(tp+tr), each 0
  when its denominator is 0; macro = mean of per-sample values, micro = the same formulas on summed
  counts (:func:`aggregate_metrics`; the authors' ``compute_metrics`` prints both). The sample score is
  ``tf1``. Every sample's result line carries its counts in ``extra`` (``TP``, ``FP``, ``FN``; not in
  ``subscores``, which hold values in [0, 1]); :data:`MICRO_METRICS` says how the report forms each
  micro metric from them (config ``benchmarks.finmcp.aggregate.average``, default ``micro``: the paper's
  TF1 46.78 is the F1 of its TP 54.04 and TR 41.23, which a macro mean of per-sample F1 would not be).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from envace.core.environment import EpisodeError, Score, Services, Task
from envace.core.tools import ToolCall

__all__ = ["FinMcpAdapter", "FinMcpEpisode", "load_samples", "tool_counts", "sample_metrics",
           "aggregate_metrics", "gold_tool_names", "COUNT_KEYS", "MICRO_METRICS"]

DEFAULT_DATA = "data/finmcp/benchmark_final.json"
DATA_VERSION = "DianJin-TIR FinMCP-Bench (data file sha256 recorded in manifests)"


#: Keys of a result line's ``extra`` holding the sample's tool-name counts.
COUNT_KEYS = ("TP", "FP", "FN")
#: Micro metric -> (numerator, denominator), each ``{count key: coefficient}``: the metric is
#: ``sum(num) / sum(den)`` over samples (0 when the denominator is 0). ``tf1`` = 2TP / (2TP + FP + FN),
#: which equals 2·P·R / (P + R) of the micro precision P and recall R. ``score`` is the sample's ``tf1``.
MICRO_METRICS: dict[str, tuple[dict[str, float], dict[str, float]]] = {
    "tp": ({"TP": 1.0}, {"TP": 1.0, "FP": 1.0}),
    "tr": ({"TP": 1.0}, {"TP": 1.0, "FN": 1.0}),
    "tf1": ({"TP": 2.0}, {"TP": 2.0, "FP": 1.0, "FN": 1.0}),
    "score": ({"TP": 2.0}, {"TP": 2.0, "FP": 1.0, "FN": 1.0}),
}


def _safe_div(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def tool_counts(pred: Iterable[str], gold: Iterable[str]) -> tuple[int, int, int]:
    """``(TP, FP, FN)`` of two tool-name multisets."""
    p, g = Counter(pred), Counter(gold)
    return sum((p & g).values()), sum((p - g).values()), sum((g - p).values())


def _prf(tp: int, fp: int, fn: int) -> dict[str, float]:
    precision = _safe_div(tp, tp + fp)
    recall = _safe_div(tp, tp + fn)
    return {"tp": precision, "tr": recall, "tf1": _safe_div(2 * precision * recall, precision + recall)}


def sample_metrics(pred: Iterable[str], gold: Iterable[str]) -> dict[str, float]:
    """Per-sample ``tp`` (tool precision), ``tr`` (tool recall), ``tf1``."""
    return _prf(*tool_counts(pred, gold))


def aggregate_metrics(counts: Iterable[tuple[int, int, int]]) -> dict[str, float]:
    """Macro and micro TP / TR / TF1 over per-sample ``(TP, FP, FN)`` counts."""
    rows = list(counts)
    per = [_prf(*c) for c in rows]
    out = {f"macro_{k}": _safe_div(sum(p[k] for p in per), len(per)) for k in ("tp", "tr", "tf1")}
    total = tuple(sum(c[i] for c in rows) for i in range(3))
    out.update({f"micro_{k}": v for k, v in _prf(*total).items()})
    out["n"] = float(len(rows))
    return out


def _calls(message: Mapping[str, Any]) -> list[tuple[str, dict[str, Any], str | None]]:
    out = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                args = {"__raw__": args}
        out.append((str(fn["name"]), args if isinstance(args, dict) else {"__value__": args}, call.get("id")))
    return out


def gold_tool_names(messages: list[Mapping[str, Any]]) -> list[str]:
    """Tool names of every call in a conversation, in order (the authors' extraction)."""
    return [name for m in messages for name, _, _ in _calls(m)]


def load_samples(path: str | Path) -> list[dict[str, Any]]:
    """Samples of a FinMCP-Bench data file (JSON list or JSON lines), ``error`` samples dropped."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"FinMCP-Bench data file {path} not found (config benchmarks.finmcp.data; "
                                "the data is published on Hugging Face by DianJin)")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except ValueError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of samples")
    for i, sample in enumerate(data):
        if not isinstance(sample, dict) or "messages" not in sample or "id" not in sample:
            raise ValueError(f"{path}: sample {i} lacks 'id' or 'messages'")
    return [s for s in data if not s.get("error", False)]


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string"


def _tools_from_gold(messages: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    props: dict[str, dict[str, dict[str, str]]] = {}
    for m in messages:
        for name, args, _ in _calls(m):
            tool = props.setdefault(name, {})
            for key, value in args.items():
                tool.setdefault(key, {"type": _json_type(value)})
    return [{"type": "function", "function": {
        "name": name, "description": f"Financial MCP tool {name}.",
        "parameters": {"type": "object", "properties": p}}} for name, p in props.items()]


def _key(name: str, args: Mapping[str, Any]) -> str:
    return name + "\x00" + json.dumps(args, sort_keys=True, ensure_ascii=False)


class FinMcpEpisode:
    """One replayed FinMCP conversation (see the module docstring)."""

    def __init__(self, task: Task) -> None:
        self.messages: list[dict[str, Any]] = task.meta["messages"]
        self.gold_names = gold_tool_names(self.messages)
        self.exact: dict[str, str] = {}
        self.by_name: dict[str, str] = {}
        queue: list[tuple[str, dict[str, Any], str | None]] = []
        for m in self.messages:
            if m.get("role") == "assistant":
                queue = _calls(m)
            elif m.get("role") == "tool" and queue:
                ids = [c[2] for c in queue]
                i = ids.index(m["tool_call_id"]) if m.get("tool_call_id") in ids else 0
                name, args, _ = queue.pop(i)
                self._remember(name, args, m.get("content", ""))
        self.user_turns = [m.get("content", "") for m in self.messages if m.get("role") == "user"][1:]
        self.pred: list[str] = []

    def _remember(self, name: str, args: dict[str, Any], content: Any) -> None:
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        self.exact.setdefault(_key(name, args), text)
        self.by_name.setdefault(name, text)

    def step(self, call: ToolCall) -> str:
        self.pred.append(call.name)
        hit = self.exact.get(_key(call.name, call.arguments))
        if hit is None:
            hit = self.by_name.get(call.name)
        if hit is None:
            return json.dumps({"error": f"unknown tool '{call.name}'"})
        return hit

    def user_reply(self, assistant_text: str) -> str | None:
        return self.user_turns.pop(0) if self.user_turns else None

    def score(self) -> Score:
        tp, fp, fn = tool_counts(self.pred, self.gold_names)
        metrics = _prf(tp, fp, fn)
        return Score(score=metrics["tf1"], subscores=metrics,
                     extra={"TP": tp, "FP": fp, "FN": fn, "pred_tools": self.pred,
                            "gold_tools": self.gold_names})


class FinMcpAdapter:
    """FinMCP-Bench over a local copy of the published data (config ``benchmarks.finmcp``)."""

    name = "finmcp"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        self.data = Path(self.config.get("data", DEFAULT_DATA))

    def versions(self) -> dict[str, str]:
        import hashlib

        digest = hashlib.sha256(self.data.read_bytes()).hexdigest()[:16] if self.data.exists() else "missing"
        return {"finmcp-data": f"{self.data.name}@sha256:{digest}"}

    def load_tasks(self, splits: list[str], limit: int | None) -> list[Task]:
        samples = load_samples(self.data)
        tasks = []
        for split in splits:
            chosen = [s for s in samples
                      if split == "all" or str(s.get("task", "")).replace(" ", "_") == split]
            if not chosen:
                raise ValueError(f"finmcp: split {split!r} has no samples in {self.data}")
            for sample in chosen[: limit if limit is not None else None]:
                tasks.append(self._task(split, sample))
        return tasks

    @staticmethod
    def _task(split: str, sample: dict[str, Any]) -> Task:
        messages = sample["messages"]
        users = [m for m in messages if m.get("role") == "user"]
        if not users:
            raise ValueError(f"finmcp sample {sample['id']}: no user message")
        system = next((m.get("content") for m in messages if m.get("role") == "system"), None)
        return Task(task_id=str(sample["id"]), split=split, system=system,
                    first_user=users[0].get("content", ""), tools=_tools_from_gold(messages),
                    meta={"messages": messages, "scenery": sample.get("scenery"),
                          "level": (sample.get("diff_level") or {}).get("level")})

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> FinMcpEpisode:
        if "messages" not in task.meta:
            raise EpisodeError(f"finmcp task {task.task_id} has no gold messages")
        return FinMcpEpisode(task)

    def gold_turns(self, task: Task) -> list[list[ToolCall]]:
        """Gold calls per user turn (for replay tests)."""
        turns: list[list[ToolCall]] = []
        for m in task.meta["messages"]:
            if m.get("role") == "user":
                turns.append([])
            elif turns:
                turns[-1].extend(ToolCall(n, a) for n, a, _ in _calls(m))
        return turns
