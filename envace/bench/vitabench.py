"""VitaBench adapter (delivery, instore, ota, cross_domain) for the source-installed ``vita`` package.

VitaBench (meituan-longcat/vitabench) is not on PyPI (the PyPI ``vita`` is another package). Verified
against commit ``96f3b8529d8ea38d330de2405af7e32a1454f6cd`` (2025-11-06, package version 0.0.1),
installed with ``pip install --no-deps`` plus its missing runtime dependencies (``thefuzz``,
``rapidfuzz``, ``holidays``, ``json-repair``). Its task files (``<data_dir>/<domain>/tasks_en.json`` for
English, ``tasks.json`` for Chinese; 100 tasks each, in the repository's ``data/vita/domains``) carry a
per-task database (``environment``), a user profile and instructions for the simulated user, and
natural-language rubrics (``evaluation_criteria.expected_states[].state_rubrics`` and
``overall_rubrics``) that an LLM judge checks against the conversation.

Implemented:
- :func:`parse_task` / :func:`load_task_file` — validation of the task format with clear errors.
- :func:`collect_rubrics` — the rubric list (state rubrics, then overall rubrics, first occurrence
  only), the order in which the judge indexes them as ``rubric_0, rubric_1, ...``.
- The rubric judge (VitaBench's default ``trajectory`` evaluation, ``TrajectoryEvaluator``): the
  conversation is cut into windows of 10 messages overlapping by 2 (:func:`sliding_windows`); each
  window is judged with vita's own sliding-window prompt (task time + weekday, user instruction, window
  i of n) and the current rubric states; a verdict of a later window replaces an earlier one
  (:func:`apply_verdicts`); reward 1 iff every rubric is met (and there is at least one), with the met
  fraction as a sub-score (:func:`score_from_verdicts`). :func:`parse_judge_output` reads the judge's
  JSON list of ``{"rubric_idx", "justification", "meetExpectation"}`` (broken JSON is repaired with
  ``json_repair`` when installed, as vita does); an unparsable answer keeps the current states, an entry
  without ``meetExpectation`` keeps that rubric's state, as vita does.
- :class:`VitaEpisode` — the episode protocol over a :class:`ToolBackend` (the vita environment in
  real runs, a stand-in in tests): VitaBench's fixed greeting opens, the simulated user answers it;
  agent calls by parsed name + arguments only, through vita's ``Environment.get_response`` (an unknown
  tool, bad arguments or any exception become vita's ``"Error: ..."`` observation); an LLM user
  simulator with vita's system prompt through an OpenAI-compatible endpoint; ``###STOP###`` /
  ``###TRANSFER###`` / ``###OUT-OF-SCOPE###`` from the user, or ``###STOP###`` in the agent's reply,
  end the conversation (vita's ``USER_STOP`` / ``AGENT_STOP``). Tool errors are counted (``extra``) but
  do not zero the reward: vita's orchestrator declares ``max_errors=10`` but never counts errors.
- The vita environment (:class:`_VitaToolBackend`): built as ``vita.run`` builds it (the registered
  domain constructor, ``get_cross_environment("delivery,instore,ota", ...)`` for cross-domain), in a
  worker thread of its own whose vita registries (stores, products, locations: per-thread class-level
  state that the tools read) are reset first, as vita resets them per simulation; every call runs in
  that thread, so interleaved episodes in one process do not share state. vita's loguru logging and
  its import-time prints are silenced.

Verified here with the real package (``tests/bench_vitabench/test_real_vita.py``; CPU): tasks of all
four splits load (hand-made fixtures valid for vita's databases; real records of delivery and instore)
with the agent system prompt, tool schemas and user-simulator prompt equal to what vita builds; valid
calls create orders in every split's database (the cross-domain one reaching both delivery and hotel
tools), an unknown tool, an unexpected and a missing argument give vita's error observations;
interleaved episodes stay isolated; the gold orders of the real records replay to orders with the
gold store, products, quantities, price and payment state; our rubric judge sends the same system
prompts, window transcripts and rubric states as vita's ``TrajectoryEvaluator`` and reaches the same
verdicts, reward and fraction given the same scripted judge answers; the agent stop token ends the
conversation; the gold orders of the real records also pass through the full evaluation runner
(:func:`envace.bench.selfcheck.replay_gold`, scripted agent, rule judge: 3/3). Over the release's
delivery and instore task files (200 tasks, English; the Chinese ones load too) 904 of 941 replayable
gold orders replay exactly (the others are inconsistent gold records: a price differing from the
store's, a stray space in a time, a product missing from the store). The OTA and cross-domain task
files (over 4 MiB) could not be fetched here: those splits are verified on hand-made tasks only.

Not verified here: the LLM user simulator and the LLM judge end to end (only scripted ones and a
stand-in OpenAI client), an evaluation with a served model, and the OTA / cross-domain release tasks.

Simplifications (ours): the protocol's static ``Task.first_user`` cannot hold a sampled message, so it
is ``""`` and the runner must call :meth:`VitaEpisode.first_user_message` (the user simulator answers
VitaBench's greeting; ``Task.meta["first_user_from_episode"]``). Each agent tool call is recorded as
its own assistant message (vita keeps parallel calls in one message, which shifts the judge's window
boundaries for turns with several calls). A user-simulator turn without text is asked again (vita
would fail and retry the whole task). Locations are reset per episode (vita keeps them across the
tasks one worker thread runs). vita's order ids hash the wall-clock time, so they differ between runs.
vita sets its prompt language process-wide: run one language per process.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import io
import json
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from envace.bench.tau2 import OpenAIUserModel, UserModel
from envace.common.openai_client import openai_client
from envace.core.environment import Endpoint, EpisodeError, Score, Services, Task
from envace.core.tools import ToolCall

__all__ = [
    "SPLITS",
    "VITABENCH_COMMIT",
    "INSTALL_HINT",
    "NO_JUSTIFICATION",
    "make_vita_environment",
    "VitaTask",
    "Verdict",
    "parse_task",
    "load_task_file",
    "collect_rubrics",
    "sliding_windows",
    "parse_judge_output",
    "apply_verdicts",
    "score_from_verdicts",
    "format_transcript",
    "RubricJudge",
    "ToolBackend",
    "VitaEpisode",
    "VitaBenchAdapter",
]

#: split (config ``benchmarks.vitabench.splits``) -> the vita environment domain (cross-domain tasks
#: combine the tools of the three single domains).
SPLITS: dict[str, str] = {
    "delivery": "delivery",
    "instore": "instore",
    "ota": "ota",
    "cross_domain": "delivery,instore,ota",
}
VITABENCH_COMMIT = "96f3b8529d8ea38d330de2405af7e32a1454f6cd"  # the vitabench commit verified against
INSTALL_HINT = (
    'VitaBench needs the source-installed "vita" package: pip install --no-deps '
    f'"vita @ git+https://github.com/meituan-longcat/vitabench@{VITABENCH_COMMIT}" '
    "thefuzz holidays json-repair (see environment.yml)"
)
STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")  # vita.user.base
AGENT_STOP_TOKEN = "###STOP###"  # vita.agent.base.BaseAgent.STOP_TOKEN: the agent ends the conversation
MAX_USER_ROUNDS = 30  # ours: user-simulator calls per reply before the conversation is cut
GREETINGS = {
    "english": "Hello, how can I help you?",
    "chinese": "你好，请问需要什么服务？",
}  # vita's first agent turn


def _vita(module: str) -> Any:
    """Import ``vita.<module>`` or fail with :data:`INSTALL_HINT`.

    vita logs every tool response through loguru at DEBUG level and prints its model list on import;
    its loguru output is disabled and the import's stdout is swallowed, so evaluation logs stay readable.
    """
    import importlib

    try:
        from loguru import logger

        logger.disable("vita")
    except ImportError:  # loguru is a dependency of vita: without it the import below fails clearly
        pass
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return importlib.import_module(f"vita.{module}")
    except ImportError as exc:
        raise EpisodeError(f"{INSTALL_HINT} ({exc})") from exc


# --------------------------------------------------------------------------------------------------
# Task format


@dataclass(frozen=True)
class VitaTask:
    """One parsed VitaBench task."""

    task_id: str
    split: str
    environment: dict[str, Any]  # the task's database (``time``, ``user_id``, stores / shops / ...)
    user_profile: dict[str, Any]
    instructions: str  # the simulated user's goal
    rubrics: tuple[str, ...]
    time: str


def _require(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise ValueError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind):
        raise ValueError(f"{where}: field {key!r} must be {kind}, got {type(value).__name__}")
    return value


def collect_rubrics(criteria: Mapping[str, Any] | None) -> list[str]:
    """State rubrics of every expected state, then the overall rubrics; each text once (first
    occurrence), in that order — the judge's ``rubric_<i>`` numbering."""
    if not criteria:
        return []
    ordered: list[str] = []
    for state in criteria.get("expected_states") or []:
        ordered += list(state.get("state_rubrics") or [])
    ordered += list(criteria.get("overall_rubrics") or [])
    return list(dict.fromkeys(ordered))


def parse_task(obj: Any, split: str) -> VitaTask:
    """Validate one task object of a VitaBench task file (``split`` = the file's domain)."""
    if split not in SPLITS:
        raise ValueError(f"unknown VitaBench split {split!r}; known: {', '.join(SPLITS)}")
    if not isinstance(obj, dict):
        raise ValueError(f"VitaBench {split}: a task must be an object, got {type(obj).__name__}")
    task_id = str(_require(obj, "id", (str, int), f"VitaBench {split} task"))
    where = f"VitaBench {split} task {task_id}"
    environment = _require(obj, "environment", dict, where)
    time = _require(environment, "time", str, f"{where} environment")
    scenario = _require(obj, "user_scenario", dict, where)
    profile = _require(scenario, "user_profile", dict, f"{where} user_scenario")
    instructions = _require(obj, "instructions", str, where)
    if obj.get("message_history"):
        raise ValueError(f"{where}: a non-empty message_history is not supported")
    criteria = obj.get("evaluation_criteria")
    if criteria is not None and not isinstance(criteria, dict):
        raise ValueError(f"{where}: evaluation_criteria must be an object")
    for state in (criteria or {}).get("expected_states") or []:
        if not isinstance(state, dict) or not all(
            isinstance(r, str) for r in state.get("state_rubrics") or []
        ):
            raise ValueError(f"{where}: expected_states must be objects with string state_rubrics")
    if not all(isinstance(r, str) for r in (criteria or {}).get("overall_rubrics") or []):
        raise ValueError(f"{where}: overall_rubrics must be strings")
    return VitaTask(
        task_id, split, environment, profile, instructions, tuple(collect_rubrics(criteria)), time
    )


def task_file(data_dir: str | Path, split: str, language: str) -> Path:
    """``<data_dir>/<split>/tasks_en.json`` (English) or ``tasks.json`` (Chinese)."""
    if language not in GREETINGS:
        raise ValueError(f"unknown VitaBench language {language!r}; known: {', '.join(GREETINGS)}")
    return Path(data_dir) / split / ("tasks_en.json" if language == "english" else "tasks.json")


def load_task_file(path: str | Path, split: str) -> list[VitaTask]:
    """All tasks of one task file, in file order; duplicate ids are an error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"VitaBench task file not found: {path} (data: the vitabench repository's "
            "data/vita/domains or its Hugging Face copy)"
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"{path}: a task file must hold a JSON list")
    tasks = [parse_task(obj, split) for obj in data]
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate task ids")
    return tasks


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


# --------------------------------------------------------------------------------------------------
# Episodes


class ToolBackend(Protocol):
    """The task's tool environment: ``execute(name, arguments) -> (observation text, is_error)``."""

    def execute(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]: ...


def _vita_registry_classes() -> list[type]:
    """vita's classes with per-thread instance registries (stores, products, locations): every
    subclass of ``vita.data_model.thread_safe_base.ThreadSafeBase``."""
    base = _vita("data_model.thread_safe_base").ThreadSafeBase
    _vita("registry")  # imports every domain, so every registry class exists
    seen: list[type] = []
    stack = list(base.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls not in seen:
            seen.append(cls)
            stack.extend(cls.__subclasses__())
    return seen


def _reset_vita_thread_state() -> None:
    """Forget the registries of the calling thread (vita's ``run._clear_global_state`` clears stores and
    products; we clear locations too, so that address look-ups see this task's addresses only) and drop
    those of finished threads."""
    for cls in _vita_registry_classes():
        cls.clear_thread_data()
        cls.cleanup_thread()


def make_vita_environment(task: VitaTask, language: str) -> Any:
    """The vita ``Environment`` of ``task`` built as ``vita.run`` builds it: the registered domain
    constructor, or ``get_cross_environment`` for the cross-domain split, on a copy of the task's
    database. Call it in the thread that will use the environment (vita's registries are per thread)."""
    import copy

    domain = SPLITS[task.split]
    environment = copy.deepcopy(task.environment)
    if "," in domain:
        return _vita("environment.environment").get_cross_environment(domain, environment, language)
    return _vita("registry").registry.get_env_constructor(domain)(environment, language)


class _VitaToolBackend:
    """A vita ``Environment`` (single or cross domain) for one task.

    vita keeps its stores, products and locations in per-thread class-level registries that the tools
    read (e.g. ``StoreProduct.get_all_products()``); vita itself runs each simulation in a worker thread
    after clearing them. Likewise every backend owns one worker thread: the environment is built and
    every call executed there, after a reset of that thread's registries, so episodes interleaved in one
    process (the runner's concurrency) never see each other's data.
    """

    def __init__(self, task: VitaTask, language: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vita-episode")
        self._finalizer = weakref.finalize(self, self._pool.shutdown, wait=False)
        self.env = self._pool.submit(self._build, task, language).result()
        self._message = _vita("data_model.message")
        self._calls = 0

    @staticmethod
    def _build(task: VitaTask, language: str) -> Any:
        _reset_vita_thread_state()
        return make_vita_environment(task, language)

    def _call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        self._calls += 1
        call = self._message.ToolCall(
            id=f"call_{self._calls}", name=name, arguments=arguments, requestor="assistant"
        )
        with contextlib.redirect_stderr(io.StringIO()):  # vita prints the traceback of a failed call
            response = self.env.get_response(call)
        return (response.content or ""), bool(response.error)

    def execute(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        return self._pool.submit(self._call, name, arguments).result()

    def run(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(environment)`` in the backend's thread (tests: inspect the database)."""
        return self._pool.submit(fn, self.env).result()

    def close(self) -> None:
        self._finalizer()


class VitaEpisode:
    """One VitaBench conversation (see the module docstring)."""

    def __init__(
        self,
        task: VitaTask,
        tools: ToolBackend,
        user_model: UserModel,
        user_system: str,
        judge: RubricJudge | None,
        seed: int,
        language: str,
        info: Mapping[str, Any],
    ) -> None:
        self.task = task
        self.tools = tools
        self.user_model = user_model
        self.judge = judge
        self.seed = seed
        self.greeting = GREETINGS[language]
        self.info = dict(info)
        self.records: list[dict[str, Any]] = [{"role": "assistant", "content": self.greeting}]
        self.user_chat: list[dict[str, Any]] = [{"role": "system", "content": user_system}]
        self.over = False
        self.agent_stopped = False
        self._opening: str | None = None
        self.num_errors = 0

    def _user(self, agent_text: str) -> str | None:
        self.user_chat.append({"role": "user", "content": agent_text})
        for _ in range(MAX_USER_ROUNDS):
            turn = self.user_model.complete(self.user_chat, None, self.seed)
            text = (turn.content or "").strip()
            if turn.tool_calls or not text:  # VitaBench users have no tools
                self.user_chat.append({"role": "assistant", "content": text or "(empty)"})
                self.user_chat.append({"role": "user", "content": "Please reply to the agent in text."})
                continue
            self.user_chat.append({"role": "assistant", "content": text})
            self.records.append({"role": "user", "content": text})
            if any(token in text for token in STOP_TOKENS):
                self.over = True
                return None
            return text
        raise EpisodeError("user simulator produced no text reply")

    def first_user_message(self) -> str:
        """The simulated user's answer to VitaBench's greeting; the same text on repeated calls."""
        if self._opening is None:
            if len(self.records) != 1:
                raise EpisodeError("first_user_message() must come before any other episode call")
            reply = self._user(self.greeting)
            if reply is None:
                raise EpisodeError("the user simulator ended the conversation before stating a request")
            self._opening = reply
        return self._opening

    def _require_opening(self) -> None:
        if self._opening is None:
            raise EpisodeError(
                "VitaBench episodes start with first_user_message() (the simulated user's "
                "opening); the runner did not ask for it"
            )

    def step(self, call: ToolCall) -> str:
        self._require_opening()
        if self.over:
            return "Error: the conversation has ended."
        arguments = call.arguments if isinstance(call.arguments, dict) else {}
        try:
            text, error = self.tools.execute(str(call.name), arguments)
        except Exception as exc:  # the backend never sees model text; any failure is an observation
            text, error = f"Error: {exc}", True
        self.num_errors += error
        self.records.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"name": str(call.name), "arguments": arguments}],
            }
        )
        self.records.append({"role": "tool", "content": text})
        return text

    def user_reply(self, assistant_text: str) -> str | None:
        self._require_opening()
        if self.over:
            return None
        self.records.append({"role": "assistant", "content": assistant_text})
        if AGENT_STOP_TOKEN in assistant_text:  # vita: the agent's stop ends the conversation at once
            self.over = True
            self.agent_stopped = True
            return None
        return self._user(assistant_text)

    def score(self) -> Score:
        extra = {
            "split": self.task.split,
            "vita_task_id": self.task.task_id,
            "num_tool_errors": self.num_errors,
            "num_messages": len(self.records),
            "user_stopped": self.over and not self.agent_stopped,
            "agent_stopped": self.agent_stopped,
            **self.info,
        }
        if self.judge is None:
            raise EpisodeError("VitaBench needs a judge endpoint (Services.judge)")
        states, unparsed = self.judge.judge(self.records, self.task.rubrics)
        score = score_from_verdicts(self.task.rubrics, states)
        return Score(
            score.score, score.subscores, {**extra, **score.extra, "judge_unparsed_windows": unparsed}
        )


# --------------------------------------------------------------------------------------------------
# Adapter


class VitaBenchAdapter:
    """VitaBench on the source-installed ``vita`` package.

    Args:
        data_dir: the folder holding ``<split>/tasks_en.json`` (the repository's ``data/vita/domains``).
        language: ``english`` (our choice; ``tasks_en.json``) or ``chinese``.
        user_simulator, judge: model names (config), recorded in results.
        user_temperature, judge_temperature: sampling temperatures (ours: 0.0).
        window, overlap: the judge's sliding window (VitaBench: 10, 2).
        tool_backend_factory, user_model_factory, judge_factory: stand-ins for tests (``(task) ->
            ToolBackend``, ``(task, services) -> UserModel``, ``(task, services) -> judge complete``);
            ``system_factory``: ``(task) -> (agent system prompt, tool schemas, user system prompt)``;
            ``judge_prompt_factory``: ``(task, window index, windows) -> judge system prompt``.
        **_: other config keys (``package``, ``splits``, ``aggregate``) are ignored.
    """

    name = "vitabench"

    def __init__(
        self,
        data_dir: str | Path | None = None,
        language: str = "english",
        user_simulator: str | None = None,
        judge: str | None = None,
        user_temperature: float = 0.0,
        judge_temperature: float = 0.0,
        window: int = 10,
        overlap: int = 2,
        tool_backend_factory: Callable[[VitaTask], ToolBackend] | None = None,
        user_model_factory: Callable[[VitaTask, Services], UserModel] | None = None,
        judge_factory: Callable[[VitaTask, Services], Callable[[list[dict[str, Any]]], str]] | None = None,
        system_factory: Callable[[VitaTask], tuple[str, list[dict[str, Any]], str]] | None = None,
        judge_prompt_factory: Callable[[VitaTask, int, int], str] | None = None,
        **_: Any,
    ) -> None:
        if language not in GREETINGS:
            raise ValueError(f"unknown VitaBench language {language!r}; known: {', '.join(GREETINGS)}")
        sliding_windows(0, window, overlap)  # validates the window
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.language = language
        self.user_simulator = user_simulator
        self.judge_model = judge
        self.user_temperature = float(user_temperature)
        self.judge_temperature = float(judge_temperature)
        self.window = window
        self.overlap = overlap
        self.tool_backend_factory = tool_backend_factory
        self.user_model_factory = user_model_factory
        self.judge_factory = judge_factory
        self.system_factory = system_factory
        self.judge_prompt_factory = judge_prompt_factory
        self._tasks: dict[str, VitaTask] = {}

    def versions(self) -> dict[str, str]:
        try:
            package = importlib.metadata.version("vita")
        except importlib.metadata.PackageNotFoundError:
            package = "not installed"
        return {
            "vita": package,
            "vitabench_data_sha256": self._data_digest(),
            "language": self.language,
            "user_simulator": str(self.user_simulator),
            "judge": str(self.judge_model),
            "user_simulator_temperature": str(self.user_temperature),
            "judge_temperature": str(self.judge_temperature),
            "judge_window": f"{self.window}/{self.overlap}",
        }

    def _data_digest(self) -> str:
        """sha256 over the task files of every split present under ``data_dir`` (this language)."""
        if self.data_dir is None:
            return "no data_dir"
        digest = hashlib.sha256()
        for split in SPLITS:
            path = task_file(self.data_dir, split, self.language)
            if path.is_file():
                digest.update(f"{split}\n".encode())
                digest.update(path.read_bytes())
        return digest.hexdigest()

    def _system(self, task: VitaTask) -> tuple[str, list[dict[str, Any]], str]:
        """Agent system prompt, agent tool schemas and user-simulator system prompt from ``vita``."""
        if self.system_factory is not None:
            return self.system_factory(task)
        backend = _VitaToolBackend(task, self.language)
        try:
            policy = backend.env.get_policy()
            tools = [t.openai_schema for t in backend.env.get_tools()]
        finally:
            backend.close()
        # vita's LLMAgent: the policy's {time} is the task time followed by its weekday
        weekday = _vita("utils.utils").get_weekday(task.time, self.language)
        agent_system = policy.format(time=f"{task.time} {weekday}")
        return agent_system, tools, self._user_system(task)

    def _user_system(self, task: VitaTask) -> str:
        """vita's user-simulator system prompt (guidelines with the persona and instructions)."""
        if self.system_factory is not None:
            return self.system_factory(task)[2]
        simulator = _vita("user.user_simulator").UserSimulator(
            persona=str(task.user_profile), instructions=task.instructions, language=self.language
        )
        return str(simulator.system_prompt)

    def load_tasks(self, splits: list[str], limit: int | None) -> list[Task]:
        if self.data_dir is None:
            raise ValueError("VitaBench needs data_dir (the folder with <split>/tasks_en.json)")
        tasks = []
        for split in splits:
            if split not in SPLITS:
                raise ValueError(f"unknown VitaBench split {split!r}; known: {', '.join(SPLITS)}")
            path = task_file(self.data_dir, split, self.language)
            parsed = load_task_file(path, split)
            for t in parsed[: limit if limit is not None else len(parsed)]:
                task_id = f"{split}/{t.task_id}"
                self._tasks[task_id] = t
                system, tools, _ = self._system(t)
                tasks.append(
                    Task(
                        task_id=task_id,
                        split=split,
                        system=system,
                        first_user="",
                        tools=tools,
                        meta={
                            "split": split,
                            "vita_task_id": t.task_id,
                            "num_rubrics": len(t.rubrics),
                            "first_user_from_episode": True,
                        },
                    )
                )
        return tasks

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> VitaEpisode:
        if task.task_id not in self._tasks:
            raise EpisodeError(f"unknown VitaBench task {task.task_id!r} (load_tasks first)")
        vt = self._tasks[task.task_id]
        tools = (
            self.tool_backend_factory(vt)
            if self.tool_backend_factory
            else _VitaToolBackend(vt, self.language)
        )
        if self.user_model_factory is not None:
            user_model = self.user_model_factory(vt, services)
        elif services.user_simulator is None:
            raise EpisodeError("VitaBench needs a user simulator endpoint (Services.user_simulator)")
        else:
            user_model = OpenAIUserModel(services.user_simulator, self.user_temperature)
        if self.judge_factory is not None:
            complete = self.judge_factory(vt, services)
        elif services.judge is not None:
            complete = OpenAIJudge(services.judge, self.judge_temperature)
        else:
            complete = None
        judge = None
        if complete is not None:
            judge = RubricJudge(
                complete, lambda i, n: self._judge_system(vt, i, n), self.window, self.overlap
            )
        user_system = self._user_system(vt)
        info = {
            "user_simulator": services.user_simulator.model if services.user_simulator else "injected",
            "judge": services.judge.model if services.judge else "injected",
            "user_simulator_temperature": self.user_temperature,
            "judge_temperature": self.judge_temperature,
        }
        episode_seed = int.from_bytes(hashlib.sha256(f"{seed}/{sample}".encode()).digest()[:4], "little")
        return VitaEpisode(vt, tools, user_model, user_system, judge, episode_seed, self.language, info)

    def _judge_system(self, task: VitaTask, window_idx: int, total: int) -> str:
        """VitaBench's sliding-window judge prompt (from ``vita``), with the task time and weekday."""
        if self.judge_prompt_factory is not None:
            return self.judge_prompt_factory(task, window_idx, total)
        weekday = _vita("utils.utils").get_weekday(task.time, self.language) or ""
        env_info = {"system_time": f"{task.time} {weekday}", "database": []}
        template = _vita("prompts").get_prompts(self.language).sliding_window_eval_template
        return template.format(
            env_info=env_info, user_instruction=task.instructions, window_idx=window_idx, total_windows=total
        )
