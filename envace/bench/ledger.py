"""Ledger: our executable tool benchmark for smoke scale (issue "Smoke scale that shows the science").

Not a paper benchmark: no paper number exists for it, and tables label it as ours. It exists so that a
model of smoke size can learn a tool task on CPU in minutes, and so that rehearsal fidelity has real
observations to compare with (every observation is a deterministic JSON function of the state).

Implemented:
- :class:`Ledger`, the environment state: accounts with integer balances; three tools with JSON schemas
  (:data:`TOOLS`): ``list_accounts()``, ``get_balance(account)``, ``transfer(source, target, amount)``.
  Calls are dispatched by name to whitelisted methods (:meth:`Ledger.call`); a bad call (unknown tool,
  missing/extra/ill-typed argument, unknown account, insufficient funds, non-positive amount) returns
  an ``{"error": ...}`` observation and leaves the state unchanged. Observations are JSON
  (``sort_keys``), so a rehearsal can match them exactly.
- :func:`generate_tasks`: tasks from a seed, two kinds: ``balance`` ('What is the balance of "X"?') and
  ``transfer`` ('Transfer N from "X" to "Y", then tell me the new balance of "Y".'; names quoted as
  in the calls' JSON, so that they tokenize alike in both). Each task carries its initial
  state, the reference calls, the expected final state and the expected answer number. Splits ``train``
  and ``test`` come from one stream and are disjoint (no (kind, accounts, amount, balances) in both).
  With ``show_balances`` the question first states every account's balance ('Balances: "X" 57, ...'),
  so that each observation is a function of what the dialogue shows (a ``get_balance`` result copies a
  stated number, a ``transfer`` result adds and subtracts the amount): rehearsal fidelity then has
  something a world model can learn. Without it (the default) the balances are state no dialogue shows
  and no rehearsal can match an observation exactly. The switch does not change the random stream: the
  same seed gives the same tasks either way, worded differently.
- :func:`score_episode`: verifiable outcome — the final state equals the expected one (``state``) and
  the last number of the final answer is the expected one (``answer``; the last, so that an answer
  listing many numbers does not pass by chance); the score is 1 when both hold.
- :func:`reference_record` / :func:`write_records`: a task as CM2's labelled record (``uuid``, ``tools``,
  ``messages`` with the reference calls and the real ledger's observations, ``checklists`` as
  ``[annotation][user turn][item]``), the input of ``envace data`` and of the tiny model's warm start,
  so both the verifiable reward and the checklist judge apply.
- :func:`world_records`: warm-start records for the REHEARSE role, one ``get_balance`` probe of each
  account of a task's initial state.

Simplifications (ours): one user turn per task; amounts and balances are small integers; account names
come from a fixed pool of 12.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.common.atomic import atomic_write_text
from envace.core.environment import Score, Services, Task
from envace.core.tools import ToolCall

__all__ = ["ACCOUNT_POOL", "TOOLS", "Ledger", "LedgerTask", "generate_tasks", "reference_record",
           "score_episode", "world_records", "write_records", "LedgerEpisode", "LedgerAdapter"]

ACCOUNT_POOL = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
                "mallory", "oscar")
SYSTEM = "You manage a small ledger through its tools. Use them, then answer the user briefly."


def _schema(name: str, description: str, props: dict[str, str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {k: {"type": t} for k, t in props.items()},
                       "required": list(props)}}}


TOOLS: list[dict[str, Any]] = [
    _schema("list_accounts", "Names of all accounts", {}),
    _schema("get_balance", "The balance of one account", {"account": "string"}),
    _schema("transfer", "Move an amount from one account to another",
            {"source": "string", "target": "string", "amount": "integer"}),
]
#: tool name -> {argument: JSON type}, from the schemas
_ARGS = {t["function"]["name"]: {k: v["type"] for k, v in t["function"]["parameters"]["properties"].items()}
         for t in TOOLS}


def _obs(payload: dict[str, Any]) -> str:
    # json.dumps' default separators: the text a CM2 record's parsed response is dumped back to (the warm
    # start's answer rows, envace.train.warmstart), so a model sees one spelling of an observation. With the
    # compact spelling the warm-started model copied the numbers in training and never at evaluation.
    return json.dumps(payload, sort_keys=True)


@dataclass
class Ledger:
    """Accounts and balances; :meth:`call` is the only way a model changes them."""

    balances: dict[str, int]

    def call(self, call: ToolCall) -> str:
        """The observation of one parsed call (JSON text); never raises."""
        spec = _ARGS.get(call.name)
        if spec is None:
            return _obs({"error": f"unknown tool {call.name!r}"})
        args = call.arguments
        if set(args) != set(spec):
            return _obs({"error": f"{call.name} takes arguments {sorted(spec)}, got {sorted(args)}"})
        for key, kind in spec.items():
            value = args[key]
            ok = isinstance(value, str) if kind == "string" else (isinstance(value, int)
                                                                   and not isinstance(value, bool))
            if not ok:
                return _obs({"error": f"{call.name}: {key} must be a {kind}"})
        return getattr(self, f"_{call.name}")(**args)

    def _list_accounts(self) -> str:
        return _obs({"accounts": sorted(self.balances)})

    def _get_balance(self, account: str) -> str:
        if account not in self.balances:
            return _obs({"error": f"unknown account {account!r}"})
        return _obs({"account": account, "balance": self.balances[account]})

    def _transfer(self, source: str, target: str, amount: int) -> str:
        for name in (source, target):
            if name not in self.balances:
                return _obs({"error": f"unknown account {name!r}"})
        if source == target:
            return _obs({"error": "source and target are the same account"})
        if amount <= 0:
            return _obs({"error": "amount must be positive"})
        if self.balances[source] < amount:
            return _obs({"error": f"insufficient funds in {source!r}"})
        self.balances[source] -= amount
        self.balances[target] += amount
        return _obs({"ok": True, "source_balance": self.balances[source],
                     "target_balance": self.balances[target]})


@dataclass(frozen=True)
class LedgerTask:
    """One generated task: its question, initial and expected state, reference calls and answer."""

    task_id: str
    split: str
    kind: str
    question: str
    initial: dict[str, int]
    calls: tuple[ToolCall, ...]
    expected: dict[str, int]
    answer: int
    meta: dict[str, Any] = field(default_factory=dict)

    def key(self) -> tuple:
        return (self.kind, tuple(sorted(self.initial.items())), tuple((c.name, json.dumps(c.arguments,
                sort_keys=True)) for c in self.calls))


def _statement(initial: dict[str, int]) -> str:
    """'Balances: "alice" 57, "bob" 23, "carol" 80. ' (accounts by name, so that the asked one is not
    always first)."""
    return "Balances: " + ", ".join(f'"{n}" {b}' for n, b in sorted(initial.items())) + ". "


def _one_task(rng: random.Random, split: str, index: int, show_balances: bool) -> LedgerTask:
    names = rng.sample(ACCOUNT_POOL, 3)
    initial = {n: rng.randrange(10, 100) for n in names}
    stated = _statement(initial) if show_balances else ""
    if rng.random() < 0.5:
        who = names[0]
        calls = (ToolCall("get_balance", {"account": who}),)
        return LedgerTask(f"ledger-{split}-{index}", split, "balance",
                          f'{stated}What is the balance of "{who}"?', initial, calls, dict(initial),
                          initial[who])
    source, target = names[0], names[1]
    amount = rng.randrange(1, initial[source] + 1)
    expected = dict(initial, **{source: initial[source] - amount, target: initial[target] + amount})
    calls = (ToolCall("transfer", {"source": source, "target": target, "amount": amount}),)
    question = (f'{stated}Transfer {amount} from "{source}" to "{target}", then tell me the new balance of '
                f'"{target}".')
    return LedgerTask(f"ledger-{split}-{index}", split, "transfer", question, initial, calls, expected,
                      expected[target])


def generate_tasks(seed: int, n_train: int, n_test: int,
                   show_balances: bool = False) -> dict[str, list[LedgerTask]]:
    """``{"train": [...], "test": [...]}``: the same ``seed`` gives the same tasks; no task of one split
    has the same key (kind, initial state, reference calls) as one of the other. ``show_balances``: the
    question states the balances first (the module docstring)."""
    rng = random.Random(seed)
    seen: set[tuple] = set()
    out: dict[str, list[LedgerTask]] = {"train": [], "test": []}
    for split, n in (("train", n_train), ("test", n_test)):
        while len(out[split]) < n:
            task = _one_task(rng, split, len(out[split]), show_balances)
            if task.key() not in seen:
                seen.add(task.key())
                out[split].append(task)
    return out


def score_episode(task: LedgerTask, ledger: Ledger, final_answer: str | None) -> Score:
    """1 when the final state is the expected one and the answer's last number is the expected one."""
    state_ok = ledger.balances == task.expected
    numbers = re.findall(r"-?\d+", final_answer or "")
    answer_ok = bool(numbers) and numbers[-1] == str(task.answer)
    return Score(float(state_ok and answer_ok), {"state": float(state_ok), "answer": float(answer_ok)})


def reference_record(task: LedgerTask) -> dict[str, Any]:
    """The task as a CM2-shaped record: the reference dialogue (observations from the real ledger) and
    a checklist of the call and the answer."""
    ledger = Ledger(dict(task.initial))
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": task.question}]
    for call in task.calls:
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}]})
        messages.append({"role": "tool", "name": call.name, "content": ledger.call(call)})
    subject = task.question.removeprefix(_statement(task.initial)).split(",")[0].rstrip("?")
    messages.append({"role": "assistant", "content": f"Done: the balance is {task.answer}."})
    call = task.calls[0]
    items = [
        {"question": f"Did the assistant call {call.name} with {json.dumps(call.arguments, sort_keys=True)}?",
         "focus": "tool call", "evidence": "assistant tool call", "weight": 0.6,
         "pass_condition": f"Passes if the assistant called {call.name} with exactly these arguments.",
         "failure_examples": ["The assistant answered without calling a tool."]},
        {"question": f"Did the final answer state the number {task.answer}?",
         "focus": "answer", "evidence": "final answer", "weight": 0.4,
         "pass_condition": f"Passes if the final answer to '{subject}' contains {task.answer}.",
         "failure_examples": ["The final answer gives another number or none."]},
    ]
    return {"uuid": task.task_id, "tools": TOOLS, "messages": messages, "checklists": [[items]]}


def world_records(task: LedgerTask) -> list[dict[str, Any]]:
    """Records that probe the task's initial state: for each account, the task's question followed by a
    ``get_balance`` call on that account and the real ledger's observation (uuid ``<task id>-<account>``).

    Warm-start data for the REHEARSE role only (their calls are not what the task asks for: never act on
    them): with ``show_balances`` every such observation copies a number the question states, and one
    row per account makes the rehearser look the account up rather than take the asked one. Measured
    on the smoke model: test-time ``get_balance`` rehearsals went from 0.16 to 0.70 exact match with them
    (docs/measurements.md, "Test-time rehearsal on the ledger")."""
    out = []
    for account in sorted(task.initial):
        call = ToolCall("get_balance", {"account": account})
        record = reference_record(task)
        record["uuid"] = f"{task.task_id}-{account}"
        tool_call = {"type": "function",
                     "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
        observation = Ledger(dict(task.initial)).call(call)
        record["messages"] = [*record["messages"][:2],
                              {"role": "assistant", "content": "", "tool_calls": [tool_call]},
                              {"role": "tool", "name": call.name, "content": observation}]
        out.append(record)
    return out


def write_records(tasks: list[LedgerTask], path: str | Path, world: bool = False) -> None:
    """The tasks' reference records as JSON lines (temp file, then rename); ``world``: their
    :func:`world_records` instead."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [r for t in tasks for r in world_records(t)] if world else [reference_record(t) for t in tasks]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))


class LedgerEpisode:
    """One isolated ledger per (task, sample, seed): the :class:`envace.core.environment.Episode` of a
    task."""

    def __init__(self, task: LedgerTask) -> None:
        self.task = task
        self.ledger = Ledger(dict(task.initial))
        self.final_answer: str | None = None

    def step(self, call: ToolCall) -> str:
        return self.ledger.call(call)

    def user_reply(self, assistant_text: str) -> str | None:
        self.final_answer = assistant_text
        return None  # one user turn

    def score(self) -> Score:
        return score_episode(self.task, self.ledger, self.final_answer)


class LedgerAdapter:
    """``benchmarks.ledger``: ``seed``, ``n_train``, ``n_test``, ``show_balances``; splits ``train`` /
    ``test``."""

    name = "ledger"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        cfg = (config or {}).get("ledger") or {}  # the benchmark entry's ledger: {seed, n_train, n_test, ...}
        self.seed, self.n_train, self.n_test = (int(cfg.get("seed", 0)), int(cfg.get("n_train", 64)),
                                                int(cfg.get("n_test", 32)))
        self.show_balances = bool(cfg.get("show_balances", False))
        self._tasks = generate_tasks(self.seed, self.n_train, self.n_test, self.show_balances)

    def versions(self) -> dict[str, str]:
        shown = ", balances stated" if self.show_balances else ""
        return {"ledger": f"envace generator, seed {self.seed}, {self.n_train} train / {self.n_test} test"
                          f"{shown}"}

    def load_tasks(self, splits: list[str], limit: int | None) -> list[Task]:
        out = []
        for split in splits:
            if split not in self._tasks:
                raise ValueError(f"benchmarks.ledger: unknown split {split!r}; known: train, test")
            for t in self._tasks[split][:limit]:
                out.append(Task(t.task_id, split, SYSTEM, t.question, TOOLS, {"ledger_task": t}))
        return out

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> LedgerEpisode:
        return LedgerEpisode(task.meta["ledger_task"])
