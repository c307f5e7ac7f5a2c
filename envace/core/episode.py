"""One benchmark episode against its real environment: the conversation loop around the rollout.

:func:`run_episode` runs one ``(task, sample, seed)``. The agent chat starts with ``system`` +
``first_user``; :func:`envace.core.rollout.run_rollout` runs in ``Mode.REAL`` with the episode as the
environment until the agent answers in text; ``episode.user_reply`` gives the next user message
(``None`` ends the conversation); then ``episode.score()``. The optional episode hooks
(``current_tools``, ``max_act_turns``, ``scores_parse_errors``, ``system_prompt``,
``first_user_message``) and the outcome rules are described in :mod:`envace.bench.runner`, which runs
many episodes with per-sample results and resume; :mod:`envace.core.tts` runs its own episodes through
this function.

Simplification (ours): each user turn starts a fresh :func:`run_rollout` over the whole chat so far, so
the token budget ``max_response_tokens`` applies per user turn and the prompt is re-encoded per user turn.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from envace.core.environment import Episode, Task
from envace.core.rollout import BackendError, GenerateBackend, Mode, RolloutConfig, Termination, run_rollout
from envace.core.tools import ChatTemplateTokenizer

__all__ = ["run_episode", "exception_result", "is_exception_result"]


def exception_result(exc: BaseException, where: str, **fields: Any) -> dict[str, Any]:
    """A failed sample for an exception raised by our code, an adapter or a service, not by the model:
    score 0 like any failure, ``reason`` ``"<where>: <Type>: <message>"``, and ``extra.exception``
    (``type``, ``where``), so a harness bug is told apart from a model's failure and counted
    (:func:`is_exception_result`). ``fields`` (e.g. ``trajectory``) are added to the result."""
    return {
        "score": 0.0,
        "subscores": {},
        "status": "failed",
        "reason": f"{where}: {type(exc).__name__}: {exc}",
        **fields,
        "extra": {"exception": {"type": type(exc).__name__, "where": where}},
    }


def is_exception_result(line: dict[str, Any]) -> bool:
    """True for a result line written by :func:`exception_result`."""
    return isinstance((line.get("extra") or {}).get("exception"), dict)


def _trajectory_record(
    messages: list[dict[str, Any]], terminations: list[str], turns: int, tools: list[dict[str, Any]]
) -> dict[str, Any]:
    return {"messages": messages, "terminations": terminations, "act_turns": turns, "tools": tools}


def _unit_float(value: Any) -> float | None:
    """``value`` as a float in [0, 1], or ``None`` (out of range, NaN, or not a number)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if 0.0 <= number <= 1.0 else None


async def run_episode(
    task: Task,
    episode: Episode,
    backend: GenerateBackend,
    tokenizer: ChatTemplateTokenizer,
    config: RolloutConfig,
) -> dict[str, Any]:
    """Run one episode; returns the result fields ``score, subscores, status, reason, trajectory, extra``.

    Raises :class:`BackendError` (only) when the backend fails.
    """
    messages: list[dict[str, Any]] = []
    system_fn = getattr(episode, "system_prompt", None)  # e.g. BFCL memory: the memory's current content
    system = system_fn() if callable(system_fn) else task.system
    if system:
        messages.append({"role": "system", "content": system})
    terminations: list[str] = []
    turns_left = config.max_turns
    used = 0
    failed: str | None = None
    tools = task.tools
    cap = getattr(episode, "max_act_turns", None)  # e.g. BFCL single-turn: one assistant turn, then over
    own_parse_errors = getattr(episode, "scores_parse_errors", False)
    try:
        # where a simulated user opens the conversation (tau2, VitaBench) the episode supplies it
        opener = getattr(episode, "first_user_message", None)
        messages.append({"role": "user", "content": opener() if callable(opener) else task.first_user})
        while True:
            tools_fn = getattr(episode, "current_tools", None)
            tools = tools_fn() if callable(tools_fn) else task.tools
            limit = turns_left if cap is None else min(turns_left, cap)
            cfg = replace(config, mode=Mode.REAL, max_turns=limit)
            try:
                traj = await run_rollout(backend, tokenizer, messages, tools, cfg, environment=episode)
            except BackendError:
                raise
            except (OSError, ConnectionError) as exc:
                raise BackendError(f"model backend failed: {exc}") from exc
            messages = traj.messages
            terminations.append(str(traj.termination))
            used += traj.num_turns
            turns_left = config.max_turns - used
            if traj.termination == Termination.ACT_PARSE_ERROR and own_parse_errors:
                break  # the episode scores an unparsable output itself (BFCL single-turn)
            capped = cap is not None and limit == cap and traj.termination == Termination.MAX_TURNS
            if traj.termination != Termination.FINAL_ANSWER and not capped:
                failed = f"episode ended by {traj.termination}"
                break
            reply = episode.user_reply(traj.final_answer or "")
            if reply is None:
                break
            if turns_left <= 0:
                failed = f"episode ended by {Termination.MAX_TURNS}"
                break
            messages.append({"role": "user", "content": reply})
        score = episode.score()
    except BackendError:
        raise
    except Exception as exc:  # an adapter/environment bug or bad data: a failed sample, never a crash
        return exception_result(exc, "episode",
                                trajectory=_trajectory_record(messages, terminations, used, tools))
    value = _unit_float(score.score)
    bad_sub = {k: v for k, v in score.subscores.items() if _unit_float(v) is None}
    if value is None or bad_sub:
        return {
            "score": 0.0,
            "subscores": {},
            "status": "failed",
            "reason": (f"sub-scores out of range: {bad_sub}" if bad_sub
                       else f"score out of range: {score.score!r}"),
            "trajectory": _trajectory_record(messages, terminations, used, tools),
            "extra": {},
        }
    return {
        "score": 0.0 if failed else value,
        "subscores": {k: float(v) for k, v in score.subscores.items()},
        "status": "failed" if failed else "ok",
        "reason": failed,
        "trajectory": _trajectory_record(messages, terminations, used, tools),
        "extra": {**score.extra, **({"score_if_not_failed": value} if failed else {})},
    }
