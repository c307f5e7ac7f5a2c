"""VitaBench adapter (delivery, instore, ota, cross_domain) for the source-installed ``vita`` package.

VitaBench (meituan-longcat/vitabench) is not on PyPI; ``environment.yml`` documents the install
(``pip install "git+https://github.com/meituan-longcat/vitabench"``). Its task files
(``<data_dir>/<domain>/tasks_en.json`` for English, ``tasks.json`` for Chinese; 100 tasks each) carry a
per-task database (``environment``), a user profile and instructions for the simulated user, and
natural-language rubrics (``evaluation_criteria.expected_states[].state_rubrics`` and
``overall_rubrics``) that an LLM judge checks against the conversation.

Implemented (pure Python, tested here on hand-written fixtures in ``tests/data/vitabench/``):
- :func:`parse_task` / :func:`load_task_file` — validation of the task format with clear errors.
- :func:`collect_rubrics` — the rubric list (state rubrics, then overall rubrics, first occurrence
  only), the order in which the judge indexes them as ``rubric_0, rubric_1, ...``.
- The rubric judge (VitaBench's default ``trajectory`` evaluation): the conversation is cut into
  windows of 10 messages overlapping by 2 (:func:`sliding_windows`); each window is judged with the
  current rubric states; a verdict of a later window replaces an earlier one
  (:func:`apply_verdicts`); reward 1 iff every rubric is met (and there is at least one), with the
  met fraction as a sub-score (:func:`score_from_verdicts`). :func:`parse_judge_output` reads the
  judge's JSON list of ``{"rubric_idx", "justification", "meetExpectation"}`` (code fences and text
  around the list tolerated); an unparsable answer keeps the current states, as VitaBench does.
- :class:`VitaEpisode` — the episode protocol over a :class:`ToolBackend` (the vita environment in
  real runs, a stand-in in tests): agent calls by parsed name + arguments only, errors as observations,
  an LLM user simulator through an OpenAI-compatible endpoint (``###STOP###``-style tokens end the
  conversation), ten tool errors = reward 0 (VitaBench's ``max_errors``).

Needs the ``vita`` package (imported lazily; a clear error names the install command): the domain tool
environments, the agent system prompt (policy with the task time), the user-simulator guidelines, the
judge's system prompt and the weekday shown to it. These paths are written against the package's
source and were not run here (the package cannot be installed on this machine).

Simplifications (ours): the protocol's static ``Task.first_user`` cannot hold a sampled message, so it
is ``""`` and the runner must call :meth:`VitaEpisode.first_user_message` (the user simulator answers
VitaBench's greeting; ``Task.meta["first_user_from_episode"]``). The ``vita`` package keeps global
state (the task time, class-level instance registries), so its episodes must not run concurrently in
one process.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from envace.bench.base import Endpoint, EpisodeError, Score, Services, Task
from envace.bench.tau2 import OpenAIUserModel, UserModel
from envace.tools import ToolCall

__all__ = [
    "SPLITS",
    "INSTALL_HINT",
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
INSTALL_HINT = (
    'VitaBench needs the source-installed "vita" package: '
    'pip install "git+https://github.com/meituan-longcat/vitabench" (see environment.yml)'
)
STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")  # vita.user.base
MAX_ERRORS = 10  # vita.config.DEFAULT_MAX_ERRORS
MAX_USER_ROUNDS = 30  # ours: user-simulator calls per reply before the conversation is cut
GREETINGS = {
    "english": "Hello, how can I help you?",
    "chinese": "你好，请问需要什么服务？",
}  # vita's first agent turn


def _vita(module: str) -> Any:
    """Import ``vita.<module>`` or fail with :data:`INSTALL_HINT`."""
    import importlib

    try:
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
    """The judge's current opinion on one rubric."""

    met: bool
    justification: str


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


def parse_judge_output(text: str, num_rubrics: int) -> dict[int, Verdict] | None:
    """Verdicts by rubric index from a judge answer, or ``None`` if no verdict list can be read.

    Accepted: a JSON list of objects (optionally in a code fence or surrounded by text, or wrapped in
    an object's single list value) with ``rubric_idx`` ``"rubric_<i>"`` (or ``i``), ``meetExpectation``
    (bool or "true"/"false") and ``justification``. Entries with an unknown index or an unreadable
    verdict are skipped.
    """
    candidates = [m.group(1) for m in _FENCE_RE.finditer(text)] + [text]
    data: Any = None
    for candidate in candidates:
        start, end = candidate.find("["), candidate.rfind("]")
        for piece in (candidate.strip(), candidate[start : end + 1] if 0 <= start < end else ""):
            try:
                data = json.loads(piece)
                break
            except (json.JSONDecodeError, ValueError):
                continue
        if data is not None:
            break
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
        met = _as_bool(entry.get("meetExpectation"))
        if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < num_rubrics or met is None:
            continue
        verdicts[idx] = Verdict(met, str(entry.get("justification", "")))
    return verdicts


def apply_verdicts(states: list[Verdict], verdicts: Mapping[int, Verdict] | None) -> list[Verdict]:
    """New rubric states: each verdict replaces the state of its rubric; ``None`` keeps all states."""
    updated = list(states)
    for idx, verdict in (verdicts or {}).items():
        updated[idx] = verdict
    return updated


def score_from_verdicts(rubrics: Sequence[str], states: Sequence[Verdict]) -> Score:
    """Reward 1 iff at least one rubric and all are met; sub-score ``rubric_fraction`` = met / total."""
    if len(rubrics) != len(states):
        raise ValueError(f"{len(rubrics)} rubrics but {len(states)} verdicts")
    if not rubrics:
        return Score(1.0, {}, {"note": "no rubric to evaluate"})
    met = sum(1 for s in states if s.met)
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
            import openai

            client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, timeout=timeout_s)
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


class _VitaToolBackend:
    """A vita ``Environment`` (single or cross domain) for one task. Not run here (needs ``vita``)."""

    def __init__(self, task: VitaTask, language: str) -> None:
        domain = SPLITS[task.split]
        if "," in domain:
            self.env = _vita("environment.environment").get_cross_environment(
                domain, task.environment, language
            )
        else:
            self.env = _vita("registry").registry.get_env_constructor(domain)(task.environment, language)
        self._message = _vita("data_model.message")
        self._calls = 0

    def execute(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        self._calls += 1
        call = self._message.ToolCall(
            id=f"call_{self._calls}", name=name, arguments=arguments, requestor="assistant"
        )
        response = self.env.get_response(call)
        return (response.content or ""), bool(response.error)


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
        return self._user(assistant_text)

    def score(self) -> Score:
        extra = {
            "split": self.task.split,
            "vita_task_id": self.task.task_id,
            "num_tool_errors": self.num_errors,
            "num_messages": len(self.records),
            "user_stopped": self.over,
            **self.info,
        }
        if self.num_errors >= MAX_ERRORS:
            return Score(
                0.0, {}, {**extra, "note": f"{self.num_errors} tool errors (VitaBench limit {MAX_ERRORS})"}
            )
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
        policy = backend.env.get_policy()
        agent_system = policy.format(time=task.time)  # what vita's LLMAgent.system_prompt does
        tools = [t.openai_schema for t in backend.env.get_tools()]
        simulator = _vita("user.user_simulator").UserSimulator(
            persona=str(task.user_profile), instructions=task.instructions, language=self.language
        )
        return agent_system, tools, simulator.system_prompt

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
        _, _, user_system = self._system(vt)
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
        weekday = _vita("utils").get_weekday(task.time, self.language) or ""
        env_info = {"system_time": f"{task.time} {weekday}", "database": []}
        template = _vita("prompts").get_prompts(self.language).sliding_window_eval_template
        return template.format(
            env_info=env_info, user_instruction=task.instructions, window_idx=window_idx, total_windows=total
        )
