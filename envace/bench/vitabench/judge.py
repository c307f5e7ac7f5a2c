"""VitaBench's rubric judge: sliding windows over the transcript, vita's judge output parsed into
verdicts, and the score from the rubrics' final states.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envace.common.openai_client import openai_client
from envace.core.environment import Endpoint, Score

# --------------------------------------------------------------------------------------------------
# Rubric judge


@dataclass(frozen=True)
class Verdict:
    """The judge's opinion on one rubric. In a judge *update* (:func:`parse_judge_output`) ``met`` is
    ``None`` when the answer gave no ``meetExpectation``: :func:`apply_verdicts` then keeps the previous
    state and takes only the justification, as vita's evaluator does."""

    met: bool | None
    justification: str


NO_JUSTIFICATION = "No justification provided"  # vita's text for an entry without a justification


def sliding_windows(n: int, window: int = 10, overlap: int = 2) -> list[tuple[int, int]]:
    """``[start, end)`` message ranges: one window if ``n <= window``, else windows of ``window``
    messages starting every ``window - overlap`` messages, the last one reaching the end."""
    if window <= overlap or overlap < 0:
        raise ValueError(f"need window > overlap >= 0, got window={window}, overlap={overlap}")
    if n <= window:
        return [(0, n)]
    step = window - overlap
    spans = []
    start = 0
    while True:
        spans.append((start, min(start + window, n)))
        if start + window >= n:
            return spans
        start += step


_FENCE_RE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def _load_json(text: str) -> Any:
    """The first JSON value readable from ``text``: a fenced block, the whole text, or its outermost
    ``[...]``; failing those, vita's own repair (``json_repair``, installed with vita) on the whole text."""
    candidates = [m.group(1) for m in _FENCE_RE.finditer(text)] + [text]
    for candidate in candidates:
        start, end = candidate.find("["), candidate.rfind("]")
        for piece in (candidate.strip(), candidate[start : end + 1] if 0 <= start < end else ""):
            try:
                return json.loads(piece)
            except (json.JSONDecodeError, ValueError):
                continue
    try:
        from json_repair import repair_json
    except ImportError:
        return None
    try:
        return json.loads(repair_json(text))
    except (json.JSONDecodeError, ValueError, TypeError, RecursionError):
        return None


def parse_judge_output(text: str, num_rubrics: int) -> dict[int, Verdict] | None:
    """Verdict updates by rubric index from a judge answer, or ``None`` if no verdict list can be read.

    The contract of vita's sliding-window judge: a JSON list of objects with ``rubric_idx``
    ``"rubric_<i>"``, ``justification`` and ``meetExpectation`` (vita repairs broken JSON with
    ``json_repair``; so do we when it is installed). Also accepted (ours): a code fence or text around
    the list, a list wrapped as an object's single list value, an integer index, "true"/"false" strings.
    Entries with an unknown index or an unreadable verdict (e.g. "maybe") are skipped; an entry without
    ``meetExpectation`` keeps the rubric's state (``met=None``) and a missing justification reads
    :data:`NO_JUSTIFICATION` (both as vita).
    """
    data = _load_json(text)
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        data = lists[0] if len(lists) == 1 else None
    if not isinstance(data, list):
        return None
    verdicts: dict[int, Verdict] = {}
    for entry in data:
        if not isinstance(entry, dict):
            continue
        idx = entry.get("rubric_idx")
        if isinstance(idx, str) and re.fullmatch(r"rubric_\d+", idx):
            idx = int(idx.split("_")[1])
        if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < num_rubrics:
            continue
        met = _as_bool(entry["meetExpectation"]) if "meetExpectation" in entry else None
        if "meetExpectation" in entry and met is None:
            continue
        verdicts[idx] = Verdict(met, str(entry.get("justification", NO_JUSTIFICATION)))
    return verdicts


def apply_verdicts(states: list[Verdict], verdicts: Mapping[int, Verdict] | None) -> list[Verdict]:
    """New rubric states: each update replaces its rubric's state (``met=None`` keeps the previous
    ``met``); ``None`` (an unreadable answer) keeps all states."""
    updated = list(states)
    for idx, verdict in (verdicts or {}).items():
        met = updated[idx].met if verdict.met is None else verdict.met
        updated[idx] = Verdict(met, verdict.justification)
    return updated


def score_from_verdicts(rubrics: Sequence[str], states: Sequence[Verdict]) -> Score:
    """Reward 1 iff at least one rubric and all are met; sub-score ``rubric_fraction`` = met / total."""
    if len(rubrics) != len(states):
        raise ValueError(f"{len(rubrics)} rubrics but {len(states)} verdicts")
    if not rubrics:
        return Score(1.0, {}, {"note": "no rubric to evaluate"})
    met = sum(1 for s in states if s.met is True)
    reward = 1.0 if met == len(rubrics) else 0.0
    checks = [
        {"rubric": r, "met": s.met, "justification": s.justification}
        for r, s in zip(rubrics, states, strict=True)
    ]
    return Score(reward, {"rubric_fraction": met / len(rubrics)}, {"rubric_checks": checks})


def format_transcript(records: Sequence[Mapping[str, Any]], start: int = 0) -> str:
    """One line per message with text or calls: ``[<global index>] <role>: <text> name(k=v, ...)``."""
    lines = []
    for offset, record in enumerate(records):
        text = record.get("content") or ""
        calls = [
            f"{c['name']}({', '.join(f'{k}={v!r}' for k, v in c['arguments'].items())})"
            for c in record.get("tool_calls") or []
        ]
        body = " ".join(part for part in (text, ".".join(calls)) if part)
        if body:
            lines.append(f"[{start + offset + 1}] {record['role']}: {body}")
    return "\n".join(lines)


class RubricJudge:
    """Sliding-window rubric judging (see the module docstring).

    Args:
        complete: ``messages -> answer text`` of the judge LLM.
        system_prompt: ``(window index from 1, number of windows) -> judge system prompt``.
        window, overlap: VitaBench's defaults 10 and 2.
    """

    def __init__(
        self,
        complete: Callable[[list[dict[str, Any]]], str],
        system_prompt: Callable[[int, int], str],
        window: int = 10,
        overlap: int = 2,
    ) -> None:
        self.complete = complete
        self.system_prompt = system_prompt
        self.window = window
        self.overlap = overlap

    def judge(
        self, records: Sequence[Mapping[str, Any]], rubrics: Sequence[str]
    ) -> tuple[list[Verdict], int]:
        """Final rubric states and the number of unparsable judge answers."""
        states = [Verdict(False, "Not evaluated yet") for _ in rubrics]
        spans = sliding_windows(len(records), self.window, self.overlap)
        unparsed = 0
        for i, (start, end) in enumerate(spans):
            current = [
                {
                    "rubric_idx": f"rubric_{k}",
                    "rubric": r,
                    "justification": s.justification,
                    "meetExpectation": s.met,
                }
                for k, (r, s) in enumerate(zip(rubrics, states, strict=True))
            ]
            user = (
                "# Input\n<window_content>\n"
                + format_transcript(records[start:end], start)
                + "\n</window_content>\n\n<current_rubrics>\n"
                + json.dumps(current, ensure_ascii=False, indent=2)
                + "\n</current_rubrics>\n"
            )
            answer = self.complete(
                [
                    {"role": "system", "content": self.system_prompt(i + 1, len(spans))},
                    {"role": "user", "content": user},
                ]
            )
            verdicts = parse_judge_output(answer, len(rubrics))
            unparsed += verdicts is None
            states = apply_verdicts(states, verdicts)
        return states, unparsed


class OpenAIJudge:
    """The judge LLM behind an OpenAI-compatible endpoint (verified here only with a stand-in client)."""

    def __init__(
        self,
        endpoint: Endpoint,
        temperature: float = 0.0,
        client: Any | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        if client is None:
            client = openai_client(endpoint.base_url, endpoint.api_key, timeout_s)
        self.endpoint = endpoint
        self.temperature = temperature
        self.client = client

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        response = self.client.chat.completions.create(
            model=self.endpoint.model, messages=messages, temperature=self.temperature
        )
        return response.choices[0].message.content or ""
