"""Rehearsal fidelity: how well a model's REHEARSE role predicts what a real environment returns.

Not in the paper (its "weak points" list): measured here on recorded real trajectories of benchmarks
with executable environments (BFCL multi-turn, tau^2).

Implemented:
- :func:`extract_pairs` — the real (call, observation) pairs of one trajectory. The trajectory is the
  runner's OpenAI-style chat (``trajectory.messages`` of a result line, see :func:`pairs_from_line`):
  an assistant message with ``tool_calls`` (``{"function": {"name", "arguments"}}``, arguments an object
  or a JSON string holding one) is followed by its tool messages, matched to the calls in order. Calls
  with no observation (the episode ended first), tool messages with no call (answers to unparsable
  turns) and calls whose arguments are not an object are skipped and counted.
- :func:`predict_observations` — for every pair, the model's REHEARSE prediction with teacher forcing:
  a fresh rehearsal chat (:class:`envace.core.rehearsal.RehearsalContext`, the same prompt as in training)
  whose history is the *real* conversation before the calling turn; earlier calls of the same turn are
  listed with their real observations (the rehearsal prompt's "answered without you" notes). The caller
  text is re-rendered from the parsed calls (the raw ACT text is not part of a result line).
- :func:`score_pair` — agreement of one prediction with the real observation:
  ``agree`` (both success or both error), ``exact`` (equal JSON values), ``field_f1`` (F1 of the sets of
  (JSON path, leaf value) pairs). A real observation is an **error** if it is a JSON object with a
  non-empty ``"error"`` field or text starting with ``error`` (case-insensitive; tau^2 answers failed
  calls with ``"Error: ..."``); a text that is not JSON is compared as a JSON string. The prediction is
  parsed with :func:`envace.core.rehearsal.parse_rehearsal_output`; a rehearsal error code is an error, a
  result goes through the same error rule; a malformed reply, and a pair whose rehearsal prompt does
  not fit the context limit (``pred_kind="skipped"``), score 0 on every metric.
- :func:`aggregate` — overall and per-tool means with bootstrap intervals from :mod:`envace.common.stats`:
  the resampling unit is the **task** (pairs of one task, pooled over its samples, are averaged first,
  so correlated pairs of one trajectory are not treated as independent); the pair-weighted ("micro")
  mean is reported beside it without an interval.
- :func:`reference_agreement` — the training-time counterpart, per rollout: each call a model answered
  (:attr:`envace.core.rollout.Trajectory.rehearsed`) against the training example's reference response
  for the same call (same name, equal arguments; the k-th answer to a call is compared with the k-th
  reference of that call, as the reference dialogue ordered them; answers beyond those, and calls the
  reference never made, have no reference). With the rehearsal prompt that shows the references
  (training's) this measures how faithfully REHEARSE reproduces them step by step; the trainer logs it
  as ``envace/rehearse/*`` (:func:`envace.train.verl_ext.trainer.rehearse_reference_stats`).
The report's fidelity table and figure are :mod:`envace.report.fidelity`.

Simplifications: numbers compare by value (``1 == 1.0``; booleans are not numbers); empty objects and
lists are leaves of their own. Verified on CPU with scripted backends and the tiny model (tests/core).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from envace.common.stats import TaskMatrix, bootstrap_mean, bootstrap_paired_diff
from envace.core.rehearsal import (
    CallCandidate,
    OutcomeKind,
    RehearsalContext,
    RehearsalOutcome,
    RehearsalPrompt,
    ToolRegistry,
    parse_rehearsal_output,
)
from envace.core.rollout import GenerateBackend
from envace.core.tools import ChatTemplateTokenizer, ToolCall, assistant_message, render_tool_call

__all__ = [
    "METRICS",
    "CallPair",
    "PairScore",
    "extract_pairs",
    "pairs_from_line",
    "is_error_value",
    "json_equal",
    "field_f1",
    "score_pair",
    "predict_observations",
    "aggregate",
    "paired_difference",
    "pair_record",
    "REFERENCE_COUNTS",
    "reference_agreement",
]

METRICS = ("agree", "exact", "field_f1")


@dataclass
class CallPair:
    """One real call and its real observation, with the conversation before the calling turn."""

    tool: str
    call: ToolCall
    observation: str
    history: list[dict[str, Any]]  # the messages before the assistant turn that made the call
    caller_text: str  # the assistant turn re-rendered (content + calls)
    earlier: list[tuple[ToolCall, str]] = field(default_factory=list)  # same-turn calls before this one
    task_id: str = ""
    sample: int = 0
    split: str = ""


@dataclass
class PairScore:
    """The three agreement scores of one pair (``pred_kind``: success / error / malformed / skipped)."""

    task_id: str
    sample: int
    split: str
    tool: str
    real_kind: str
    pred_kind: str
    agree: float
    exact: float
    field_f1: float


def _decode_arguments(arguments: Any) -> dict[str, Any] | None:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    return arguments if isinstance(arguments, dict) else None


def extract_pairs(messages: Sequence[Mapping[str, Any]]) -> tuple[list[CallPair], dict[str, int]]:
    """The (call, observation) pairs of one chat, and counts of what was skipped (see module docstring)."""
    pairs: list[CallPair] = []
    skipped = {"no_observation": 0, "no_call": 0, "bad_arguments": 0}
    i = 0
    while i < len(messages):
        message = messages[i]
        if message.get("role") == "tool":
            skipped["no_call"] += 1
            i += 1
            continue
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            i += 1
            continue
        calls: list[ToolCall | None] = []
        for tc in message["tool_calls"]:
            fn = tc.get("function", tc) if isinstance(tc, Mapping) else {}
            args = _decode_arguments(fn.get("arguments", {}))
            name = fn.get("name")
            calls.append(ToolCall(name, args) if isinstance(name, str) and args is not None else None)
        j = i + 1
        observations: list[str] = []
        while j < len(messages) and messages[j].get("role") == "tool":
            observations.append(str(messages[j].get("content") or ""))
            j += 1
        valid = [c for c in calls if c is not None]
        caller = assistant_message(str(message.get("content") or ""), valid)
        caller_text = _render_caller(caller)
        history = [dict(m) for m in messages[:i]]
        earlier: list[tuple[ToolCall, str]] = []
        for k, call in enumerate(calls):
            if k >= len(observations):
                skipped["no_observation"] += 1
                continue
            if call is None:
                skipped["bad_arguments"] += 1
                continue
            pairs.append(CallPair(call.name, call, observations[k], history, caller_text, list(earlier)))
            earlier.append((call, observations[k]))
        skipped["no_call"] += max(0, len(observations) - len(calls))
        i = j
    return pairs, skipped


def _render_caller(message: Mapping[str, Any]) -> str:
    parts = [str(message.get("content") or "")]
    for tc in message.get("tool_calls") or []:
        fn = tc["function"]
        parts.append(render_tool_call(ToolCall(fn["name"], fn["arguments"])))
    return "\n".join(p for p in parts if p)


def pairs_from_line(
    line: Mapping[str, Any], where: str = "result line", tools: list[dict[str, Any]] | None = None
) -> tuple[list[CallPair], list[dict], dict[str, int]]:
    """Pairs, tools and skip counts of one result line.

    Needs ``line["trajectory"]`` to be an object with ``messages`` (the whole real chat, OpenAI-style, as
    :func:`envace.core.episode.run_episode` records it) and the task's OpenAI-style tools: its own
    ``tools`` list if present, else ``tools`` (e.g. from the benchmark adapter's task); raises
    ``ValueError`` naming ``where`` otherwise.
    """
    traj = line.get("trajectory")
    if not isinstance(traj, Mapping) or not isinstance(traj.get("messages"), list):
        raise ValueError(f"{where}: 'trajectory' must be an object with a list 'messages' "
                         "(see envace/core/fidelity.py)")
    if isinstance(traj.get("tools"), list):
        tools = traj["tools"]
    if tools is None:
        raise ValueError(f"{where}: the trajectory has no 'tools' and no task tools were given "
                         "(pass --config so they come from the benchmark adapter)")
    pairs, skipped = extract_pairs(traj["messages"])
    for pair in pairs:
        pair.task_id, pair.sample, pair.split = str(line["task_id"]), int(line["sample"]), str(line["split"])
    return pairs, list(tools), skipped


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def is_error_value(value: Any) -> bool:
    """The error rule of the module docstring, on a decoded observation."""
    if isinstance(value, dict):
        err = value.get("error")
        return err not in (None, False, "", {}, [])
    return isinstance(value, str) and value.strip().lower().startswith("error")


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def json_equal(a: Any, b: Any) -> bool:
    """Strict JSON equality: numbers by value, booleans only equal booleans, same keys, same order of
    list items."""
    if _is_number(a) and _is_number(b):
        return float(a) == float(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> set[tuple[tuple[Any, ...], tuple[str, Any]]]:
    if isinstance(value, dict) and value:
        return set().union(*(_leaves(v, path + (("k", k),)) for k, v in value.items()))
    if isinstance(value, list) and value:
        return set().union(*(_leaves(v, path + (("i", n),)) for n, v in enumerate(value)))
    if isinstance(value, dict):
        return {(path, ("empty_object", None))}
    if isinstance(value, list):
        return {(path, ("empty_list", None))}
    if _is_number(value):
        return {(path, ("number", float(value)))}
    return {(path, (type(value).__name__, value))}


def field_f1(predicted: Any, real: Any) -> float:
    """F1 of the (path, leaf) sets of two JSON values (1.0 for equal values)."""
    p, r = _leaves(predicted), _leaves(real)
    hits = len(p & r)
    if hits == 0:
        return 0.0
    precision, recall = hits / len(p), hits / len(r)
    return 2 * precision * recall / (precision + recall)


def score_pair(pair: CallPair, prediction: str | None) -> PairScore:
    """Score one prediction (the raw REHEARSE reply; ``None`` = not predicted, scored 0 as skipped)."""
    real = _value(pair.observation)
    real_kind = "error" if is_error_value(real) else "success"
    pred_kind, agree, exact, f1 = "skipped", 0.0, 0.0, 0.0
    if prediction is not None:
        outcome = parse_rehearsal_output(prediction)
        if outcome.kind == OutcomeKind.MALFORMED:
            pred_kind = "malformed"
        else:
            value = json.loads(outcome.observation)
            pred_kind = "error" if outcome.kind == OutcomeKind.ERROR or is_error_value(value) else "success"
            agree = float(pred_kind == real_kind)
            exact = float(json_equal(value, real))
            f1 = field_f1(value, real)
    return PairScore(pair.task_id, pair.sample, pair.split, pair.tool, real_kind, pred_kind, agree, exact, f1)


async def predict_observations(
    pairs: Sequence[CallPair],
    tools: Sequence[Sequence[dict[str, Any]]],
    backend: GenerateBackend,
    tokenizer: ChatTemplateTokenizer,
    *,
    sampling: Mapping[str, Any],
    prompt_name: str = "rehearsal_v1",
    template_kwargs: Mapping[str, Any] | None = None,
    max_context_tokens: int = 20480,
    references: Sequence[Sequence[dict[str, Any]]] | None = None,
) -> list[str | None]:
    """The REHEARSE reply for every pair (``tools[i]``: the tools of pair ``i``'s task); ``None`` where the
    rehearsal prompt plus ``sampling["max_tokens"]`` would exceed ``max_context_tokens``.

    ``references[i]``: reference ``{"call", "response"}`` pairs shown in pair ``i``'s REHEARSE prompt, as
    training rollouts show the example's own (:class:`envace.core.rehearsal.RehearsalContext`); default
    none, as at test time."""
    if len(tools) != len(pairs) or (references is not None and len(references) != len(pairs)):
        raise ValueError("predict_observations needs one tool list (and reference list, if any) per pair")
    prompt = RehearsalPrompt(prompt_name)
    max_tokens = int(sampling.get("max_tokens", 2048))
    end = tokenizer.encode(getattr(tokenizer, "eos_token", None) or "", add_special_tokens=False)
    out: list[str | None] = []
    for k, (pair, task_tools) in enumerate(zip(pairs, tools, strict=True)):
        registry = ToolRegistry(task_tools)
        kwargs = dict(template_kwargs or {})
        refs = list(references[k]) if references is not None else []
        ctx = RehearsalContext(tokenizer, prompt, registry, list(pair.history), refs, kwargs)
        for call, observation in pair.earlier:
            ctx.note(CallCandidate(call, pair.caller_text), observation)
        ids = ctx.prompt_ids(CallCandidate(pair.call, pair.caller_text))
        if len(ids) + max_tokens > max_context_tokens:
            out.append(None)
            continue
        params = dict(sampling)
        params["max_tokens"] = max_tokens
        reply, _ = await backend.generate(list(ids), params)
        if end and reply[-len(end):] == end:
            reply = reply[: -len(end)]
        out.append(tokenizer.decode(reply, skip_special_tokens=False))
    return out


def _summarize(scores: Sequence[PairScore], bootstrap: Mapping[str, Any]) -> dict[str, Any]:
    tasks = sorted({s.task_id for s in scores})
    out: dict[str, Any] = {"n_pairs": len(scores), "n_tasks": len(tasks),
                           "pred_kinds": {k: sum(s.pred_kind == k for s in scores)
                                          for k in ("success", "error", "malformed", "skipped")},
                           "real_error_rate": float(np.mean([s.real_kind == "error" for s in scores]))}
    records = [asdict(s) for s in scores]
    for metric in METRICS:
        interval = bootstrap_mean(_task_means(records, metric, tasks), **bootstrap)
        out[metric] = {**interval.as_dict(), "micro": float(np.mean([r[metric] for r in records]))}
    return out


def aggregate(scores: Sequence[PairScore], *, resamples: int = 10_000, seed: int = 12345,
              confidence: float = 0.95) -> dict[str, Any]:
    """``{"overall": summary, "per_tool": {tool: summary}}``; each summary has, per metric, the
    task-level mean with its bootstrap interval (``point``, ``ci_low``, ``ci_high``, ...) and ``micro``."""
    if not scores:
        raise ValueError("no scored (call, observation) pairs to aggregate")
    bootstrap = {"resamples": resamples, "seed": seed, "confidence": confidence}
    tools = sorted({s.tool for s in scores})
    return {
        "overall": _summarize(scores, bootstrap),
        "per_tool": {t: _summarize([s for s in scores if s.tool == t], bootstrap) for t in tools},
    }


def _pair_key(record: Mapping[str, Any]) -> tuple[Any, ...]:
    return (record["task_id"], record["sample"], record["tool"], json.dumps(record["call"], sort_keys=True),
            record["observation"])


def _task_means(records: Sequence[Mapping[str, Any]], metric: str, tasks: list[str]) -> TaskMatrix:
    index = {t: k for k, t in enumerate(tasks)}
    rows = [index[r["task_id"]] for r in records]
    sums = np.bincount(rows, weights=[float(r[metric]) for r in records], minlength=len(tasks))
    counts = np.bincount(rows, minlength=len(tasks))
    return TaskMatrix(values=(sums / counts)[:, None], group_index=np.zeros(len(tasks), dtype=int),
                      group_weights=np.ones(1), task_ids=tuple(tasks))


def paired_difference(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], *,
                      resamples: int = 10_000, seed: int = 12345, confidence: float = 0.95
                      ) -> dict[str, Any] | None:
    """Model A's fidelity minus model B's on the same (call, observation) pairs: ``a`` and ``b`` are the
    ``pairs`` lists of two ``envace fidelity`` documents (:func:`pair_record` s) that rehearsed the same
    calls in the same order (``report.fidelity.trajectories``). Returns ``{"overall": {metric:
    interval}, "per_tool": {tool: {metric: interval}}}``, each a paired bootstrap over tasks (a task's
    pairs averaged first, as :func:`aggregate`); ``None`` when the two lists are not the same pairs (the
    documents rehearsed different trajectories) or are empty."""
    if not a or len(a) != len(b) or any(_pair_key(x) != _pair_key(y) for x, y in zip(a, b, strict=True)):
        return None
    bootstrap = {"resamples": resamples, "seed": seed, "confidence": confidence}

    def scope(keep: list[int]) -> dict[str, Any]:
        sub_a, sub_b = [a[i] for i in keep], [b[i] for i in keep]
        tasks = sorted({r["task_id"] for r in sub_a})
        out: dict[str, Any] = {"n_pairs": len(keep), "n_tasks": len(tasks)}
        for metric in METRICS:
            interval = bootstrap_paired_diff(_task_means(sub_a, metric, tasks),
                                             _task_means(sub_b, metric, tasks), **bootstrap)
            out[metric] = interval.as_dict()
        return out

    tools = sorted({r["tool"] for r in a})
    return {"overall": scope(list(range(len(a)))),
            "per_tool": {t: scope([i for i, r in enumerate(a) if r["tool"] == t]) for t in tools}}


def pair_record(pair: CallPair, prediction: str | None, score: PairScore) -> dict[str, Any]:
    """The JSON record of one scored pair (what ``envace fidelity`` stores per pair)."""
    return {**asdict(score), "call": {"name": pair.call.name, "arguments": pair.call.arguments},
            "observation": pair.observation, "prediction": prediction}


#: The counts :func:`reference_agreement` returns, in this order.
REFERENCE_COUNTS = ("answered", "malformed", "referenced", "exact", "agree")


def _call_key(name: str, arguments: Any) -> str:
    return json.dumps([name, arguments], sort_keys=True, ensure_ascii=False, default=str)


def reference_agreement(
    rehearsed: Sequence[tuple[ToolCall | None, RehearsalOutcome]],
    references: Sequence[Mapping[str, Any]],
) -> dict[str, int]:
    """Counts of one rollout (see the module docstring): ``answered`` (calls a model answered),
    ``malformed`` (of those, malformed replies), ``referenced`` (answers with a reference response),
    ``exact`` and ``agree`` (of the referenced: equal JSON value; same success/error kind; a malformed
    reply is neither). Arguments are matched by canonical JSON (key order ignored); reference items that
    are not ``{"call": {"name", "arguments"}, "response"}`` are ignored."""
    queues: dict[str, list[Any]] = {}
    for ref in references:
        call = ref.get("call") if isinstance(ref, Mapping) else None
        if isinstance(call, Mapping) and isinstance(call.get("name"), str) and "response" in ref:
            args = _decode_arguments(call.get("arguments", {}))
            if args is not None:
                queues.setdefault(_call_key(call["name"], args), []).append(ref["response"])
    counts = dict.fromkeys(REFERENCE_COUNTS, 0)
    for call, outcome in rehearsed:
        counts["answered"] += 1
        malformed = outcome.kind == OutcomeKind.MALFORMED
        counts["malformed"] += int(malformed)
        queue = queues.get(_call_key(call.name, call.arguments)) if call is not None else None
        if not queue:
            continue
        real = queue.pop(0)  # decoded JSON, as envace.train.data stores it (text that is not JSON: a string)
        counts["referenced"] += 1
        if malformed:
            continue
        value = _value(outcome.observation)
        predicted_error = outcome.kind == OutcomeKind.ERROR or is_error_value(value)
        counts["exact"] += int(json_equal(value, real))
        counts["agree"] += int(predicted_error == is_error_value(real))
    return counts
