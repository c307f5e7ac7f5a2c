"""The registered VitaBench adapter (:class:`VitaBenchAdapter`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envace.bench.tau2.user import OpenAIUserModel, UserModel
from envace.bench.vitabench.episode import ToolBackend, VitaEpisode, _VitaToolBackend
from envace.bench.vitabench.judge import OpenAIJudge, RubricJudge, sliding_windows
from envace.bench.vitabench.tasks import GREETINGS, SPLITS, VitaTask, _vita, load_task_file, task_file
from envace.core.environment import EpisodeError, Services, Task

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
