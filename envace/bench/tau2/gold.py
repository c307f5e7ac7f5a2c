"""The gold replay of tau2's base tasks through the full runner (``envace selfcheck tau2``, 278/278).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envace.bench.tau2.adapter import Tau2Adapter
from envace.bench.tau2.data import DOMAINS
from envace.bench.tau2.episode import Tau2Episode
from envace.bench.tau2.user import ScriptedUserModel, UserTurn
from envace.core.environment import Services, Task
from envace.core.tools import ToolCall, render_tool_call

# --------------------------------------------------------------------------------------------------
# Gold replay


def _gold_script(tau2_task: Any) -> tuple[list[tuple[str, list[ToolCall]]], list[UserTurn], str]:
    """Split the gold actions into runs by requestor.

    Returns ``(segments, user turns, final agent text)``: the scripted user answers the greeting with a
    text (or, if the gold actions start with user actions, with those calls and then a text), every
    later run of user actions with the calls and a text, and the final agent text (the information the
    agent must communicate) with ``###STOP###``.
    """
    criteria = tau2_task.evaluation_criteria
    segments: list[tuple[str, list[ToolCall]]] = []
    for action in (criteria.actions or []) if criteria is not None else []:
        call = ToolCall(name=action.name, arguments=dict(action.arguments))
        if segments and segments[-1][0] == action.requestor:
            segments[-1][1].append(call)
        else:
            segments.append((action.requestor, [call]))
    turns: list[UserTurn] = []
    if not segments or segments[0][0] != "user":
        turns.append(UserTurn(content="I need help."))
    for requestor, calls in segments:
        if requestor == "user":
            turns += [UserTurn(content=None, tool_calls=calls), UserTurn(content="Done.")]
    turns.append(UserTurn(content="Thanks. ###STOP###"))
    info = list(criteria.communicate_info or []) if criteria is not None else []
    final = " ; ".join(info) if info else "Is there anything else?"
    return segments, turns, final


def gold_agent_script(segments: list[tuple[str, list[ToolCall]]], final: str) -> list[str]:
    """The agent side of a gold replay as model outputs: per stretch between user actions, one message
    with that stretch's calls (parallel calls, executed in order) and a text handing over to the user;
    the last stretch ends with ``final``. A leading run of user actions belongs to the opening."""
    stretches: list[list[ToolCall]] = [[]]
    for i, (requestor, calls) in enumerate(segments):
        if requestor == "assistant":
            stretches[-1] += calls
        elif i > 0:
            stretches.append([])
    script = []
    for k, calls in enumerate(stretches):
        if calls:
            script.append("\n".join(render_tool_call(c) for c in calls))
        script.append(final if k == len(stretches) - 1 else "Please do the following on your phone.")
    return script


class _GoldAdapter(Tau2Adapter):
    """A :class:`Tau2Adapter` whose users follow the gold script of their task and whose episodes are
    opened (:meth:`Tau2Episode.first_user_message`) when created, so a replay does not depend on whether
    the runner asks for the opening."""

    def __init__(self) -> None:
        super().__init__(user_simulator="gold-script",
                         user_model_factory=lambda t, _services: ScriptedUserModel(_gold_script(t)[1]))

    def new_episode(self, task: Task, sample: int, seed: int, services: Services) -> Tau2Episode:
        episode = super().new_episode(task, sample, seed, services)
        episode.first_user_message()
        return episode


def selfcheck_tau2(limit: int | None = None, domains: Sequence[str] = DOMAINS,
                   out_dir: str | Path | None = None) -> tuple[int, int, list[dict[str, Any]]]:
    """Gold replay of the base tasks (``limit`` per domain) through the full evaluation runner.

    Each task's gold agent calls are the outputs of a :class:`envace.bench.scripted.ScriptedBackend`
    (:func:`gold_agent_script`) driven by :func:`envace.bench.runner.run_samples` — the same episode
    driver, rollout loop (``Mode.REAL``), tool-call parser and scorer as an evaluation — and its gold
    user actions come from a scripted user model. Returns ``(passed, total, failed result lines)``.
    """
    from envace.bench.selfcheck import replay_gold

    adapter = _GoldAdapter()
    tasks = adapter.load_tasks(list(domains), limit)
    scripts = {}
    for task in tasks:
        segments, _, final = _gold_script(adapter._lookup(task)[1])
        scripts[task.task_id] = gold_agent_script(segments, final)
    return replay_gold(adapter, tasks, scripts, "tau2", out_dir)
