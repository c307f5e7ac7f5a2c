"""VitaBench episodes: a vita environment per task with its tools behind a whitelist, and one
conversation with the user simulator (:class:`VitaEpisode`).
"""

from __future__ import annotations

import contextlib
import io
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from envace.bench.tau2.user import UserModel
from envace.bench.vitabench.judge import RubricJudge, score_from_verdicts
from envace.bench.vitabench.tasks import (
    AGENT_STOP_TOKEN,
    GREETINGS,
    MAX_USER_ROUNDS,
    SPLITS,
    STOP_TOKENS,
    VitaTask,
    _vita,
)
from envace.core.environment import EpisodeError, Score
from envace.core.tools import ToolCall

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
