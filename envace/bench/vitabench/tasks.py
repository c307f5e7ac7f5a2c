"""VitaBench tasks: the source-installed ``vita`` package, the splits, and the task files parsed into
:class:`VitaTask` (see :mod:`envace.bench.vitabench`).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.core.environment import EpisodeError

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
